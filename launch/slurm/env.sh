# Sourced by churn.sh and join.sh (not run): the repository root (SEEDFLOOD_ROOT, else this
# checkout) becomes the working directory, and PYTHON (its .venv's python if it exists, else
# python3) and SEEDFLOOD_ROOT are exported to the jobs they submit.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROOT=${SEEDFLOOD_ROOT:-$REPO}
cd "$ROOT"
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $ROOT/.venv/bin/python ]]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHON SEEDFLOOD_ROOT=$ROOT
