#!/usr/bin/env bash
# Submit one churn-tolerant SeedFlood run to SLURM (launch/README.md,
# docs/churn.md): the run's store as its own job (store.sbatch), then one job array with a task per
# process (churn.sbatch: task 0 the evaluator, task I client node I-1; --requeue), which starts
# once the store job runs. Run from anywhere (relative paths are taken from the repository root):
#   launch/slurm/churn.sh [SBATCH_OPTION ...] CONFIG.yaml --set churn.settle=1 [--set k=v ...]
# e.g. launch/slurm/churn.sh --time=60 --partition=cpu launch/configs/debug.yaml --set churn.settle=1
#
# SBATCH_OPTIONs (each one word: --time=60, not --time 60) go to both jobs; --array, --output,
# --comment and --dependency are set here. Paths in the config and --set values are relative to
# the repository root, as for run.sbatch. Prints `store=STOREJOB` and `array=ARRAYJOB` on stdout
# (the next steps on stderr) and exits 0 once both are submitted; a bad config or churn.settle = 0
# stops it first with one line and status 2, submitting nothing.
#
# Then: `scontrol requeue ARRAYJOB_I` makes process I leave and, when SLURM starts it again,
# rejoin (Slurm holds a requeued job ~2 minutes; 2 s after squeue shows it PENDING,
# `scontrol update JobId=ARRAYJOB_I StartTime=now` starts it at once: see churn.sbatch);
# the run directory (run.out_dir, on task 0's node) holds the result;
# `scancel STOREJOB ARRAYJOB` stops everything. The store job ends by itself when the array does.
# The store's --time must cover the whole run, restarts included: STORE_TIME sets it alone.
#
# Environment (defaults in brackets; both jobs inherit this shell's environment):
#   PYTHON [<repo>/.venv/bin/python if it exists, else python3]   interpreter with seedflood installed
#   LOG_DIR [.]            where the jobs' output files go (slurm-seedflood-{store,churn}-*.out)
#   STORE_TIME [as --time]  the store job's time limit
#   STORE_PORT [28400 + store job id % 1000]   the store's port on its node
set -euo pipefail

# shellcheck source=launch/slurm/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"   # cd to the repo root; PYTHON, SEEDFLOOD_ROOT
unset SEEDFLOOD_STORE   # the tasks find this run's own store job (a stale one from this shell would win)

OPTS=()
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
        --array* | -a* | --output* | -o* | --comment* | --dependency* | -d*)
            echo "$0: $1 is set by this script" >&2; exit 2 ;;
        --time=*) STORE_TIME=${STORE_TIME:-${1#--time=}} ;;
    esac
    OPTS+=("$1")
    shift
done
[[ $# -ge 1 ]] || { echo "usage: $0 [SBATCH_OPTION ...] CONFIG.yaml --set churn.settle=1 [--set section.field=value ...]" >&2; exit 2; }
CONFIG=$1
shift
[[ -f $CONFIG ]] || { echo "$0: config file '$CONFIG' does not exist (paths are relative to $ROOT)" >&2; exit 2; }

# Preflight here, before anything is queued (every array task checks again).
WORLD=$("$PYTHON" -m "${SEEDFLOOD_MODULE:-seedflood}" world-size --config "$CONFIG" "$@" --set checkpoint.resume=true) || exit $?
# shellcheck disable=SC2016
SETTLE=$("$PYTHON" -c 'import sys; from seedflood.core.config import runconfig; print(runconfig.load(sys.argv[1], [a for a in sys.argv[2:] if a != "--set"]).churn.settle)' "$CONFIG" "$@") || exit 2
(( SETTLE >= 1 )) || { echo "$0: churn.settle is 0 (strict): pass --set churn.settle=1 (or use launch/slurm/run.sbatch)" >&2; exit 2; }

LOG_DIR=${LOG_DIR:-.}
STORE_OPTS=("${OPTS[@]}")
[[ -n ${STORE_TIME:-} ]] && STORE_OPTS+=("--time=$STORE_TIME")
STORE=$(sbatch --parsable "${STORE_OPTS[@]}" --output="$LOG_DIR/slurm-%x-%j.out" launch/slurm/store.sbatch)
STORE=${STORE%%;*}
ARRAY=$(SEEDFLOOD_STORE_JOB=$STORE sbatch --parsable "${OPTS[@]}" --array="0-$(( WORLD - 1 ))" \
    --dependency="after:$STORE" --kill-on-invalid-dep=yes --comment="seedflood-store=$STORE" \
    --output="$LOG_DIR/slurm-%x-%A_%a.out" launch/slurm/churn.sbatch "$CONFIG" "$@") || {
    scancel "$STORE"
    exit 1
}
ARRAY=${ARRAY%%;*}
echo "store=$STORE"
echo "array=$ARRAY"
cat >&2 <<EOF
$0: store job $STORE, array job $ARRAY (tasks 0-$(( WORLD - 1 )): 0 = evaluator, I = client node I-1)
  requeue task I:  scontrol requeue ${ARRAY}_I   (back in ~2 min; at once: 2 s after squeue
                   shows it PENDING, scontrol update JobId=${ARRAY}_I StartTime=now)
  stop the run:    scancel $STORE $ARRAY
EOF
