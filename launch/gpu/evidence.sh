#!/usr/bin/env bash
# Run the GPU evidence plan on a host staged by the kit (stage.sh), writing at most 8 files to OUT:
#   bash ~/seedflood-gpu/evidence.sh OUT [--budget SECONDS] [--dry] [--only a,b,c]
# `seedflood gpu-evidence --help` lists the options. Staged home: $SEEDFLOOD_GPU_HOME, default
# this script's folder (stage.sh copies it there).
#   PYTHON [python3]   the host's interpreter (the one with torch and transformers)
set -euo pipefail
ROOT=${SEEDFLOOD_GPU_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
[[ $# -ge 1 && $1 != -* ]] || { echo "usage: $0 OUT [--budget SECONDS] [--dry] [--only a,b,c]" >&2; exit 2; }
[[ -f $ROOT/staged.json && -f $ROOT/env.sh ]] ||
    { echo "evidence: $ROOT is not a staged kit: run the kit's stage commands first" >&2; exit 2; }
OUT=$1
shift
# shellcheck source=/dev/null
source "$ROOT/env.sh"
exec "${PYTHON:-python3}" -m seedflood gpu-evidence --out "$OUT" --work "$ROOT/work" --launch "$ROOT/launch" "$@"
