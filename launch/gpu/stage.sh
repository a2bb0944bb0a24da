#!/usr/bin/env bash
# Stage this shipment of the SeedFlood GPU kit on an offline GPU host (launch/gpu/kit.py builds the
# kit and prints the commands in order). Shipments are staged in order into $SEEDFLOOD_GPU_HOME
# (default ~/seedflood-gpu); the last one installs everything offline and says in one line what
# it found and what does not fit. A missing file or a bad checksum: one line, exit 2.
#   PYTHON [python3]   the host's interpreter (the one with torch and transformers)
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/kitstage.py" "$@"
