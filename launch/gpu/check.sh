#!/usr/bin/env bash
# `make gpu-check`: the GPU kit's dry mode on this machine. Builds a kit for this interpreter
# (launch/gpu/kit.py --local), stages every shipment into a fresh home as the GPU host would
# (stage.sh: checksums, reassembly, offline install), then runs the evidence plan from that home
# with --dry (CPU, tiny model): the same files a GPU run writes, in DIR/out.
#   launch/gpu/check.sh [DIR]        (default runs/gpu-check; DIR is replaced)
#   PYTHON [<repo>/.venv/bin/python]  the interpreter with torch, transformers and pip
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
DIR=${1:-runs/gpu-check}
rm -rf "$DIR"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
"$PYTHON" "$REPO/launch/gpu/kit.py" --local --out "$DIR/kit"
export SEEDFLOOD_GPU_HOME=$DIR/home PYTHON
for ship in "$DIR"/kit/ship*; do
    bash "$ship/stage.sh"
done
bash "$DIR/home/evidence.sh" "$DIR/out" --dry --budget "${BUDGET:-600}"
