#!/usr/bin/env bash
# Add N clients with brand-new node ids to a running churn run that launch/slurm/churn.sh
# submitted (launch/README.md, One more client; docs/churn-design.md, A new id joins):
#   launch/slurm/join.sh [SBATCH_OPTION ...] STOREJOB N CONFIG.yaml --set churn.settle=1 --set churn.max_nodes=M [--set k=v ...]
# e.g. launch/slurm/join.sh --time=60 1234 2 launch/configs/debug.yaml --set churn.settle=1 --set churn.max_nodes=8
#
# STOREJOB is the run's store job (churn.sh printed `store=STOREJOB`); CONFIG and the --sets must
# be the run's own (the same bits: a newcomer with other settings would not be admitted), and the
# run must have been started with churn.max_nodes above its topology.nodes. Submits one job array
# of churn.sbatch with SEEDFLOOD_JOIN=1 whose task J is new node id J, for J = FIRST..FIRST+N-1;
# each task knocks at the run's store, a member sponsors it, it replays the log and trains to the
# end with the others (its final report is in summary.json, client_hashes[J]). The array carries
# the store job's tag (--comment=seedflood-store=STOREJOB), so the store stays up while it runs.
# `scontrol requeue JOINJOB_J` makes node J leave; started again it should rejoin like any client (launch/
# README.md on an admitted newcomer's restart; not tested under SLURM).
#
# Prints `join=JOINJOB` on stdout and exits 0 once it is submitted. Refused in one line with
# status 2, submitting nothing: a bad config, churn.settle = 0, ids outside
# topology.nodes..churn.max_nodes-1, a store job that is not RUNNING.
#
# Environment (defaults in brackets; the job inherits this shell's environment):
#   FIRST [topology.nodes]  the first new id (a second batch of newcomers starts after the first's)
#   PYTHON [<repo>/.venv/bin/python if it exists, else python3]   interpreter with seedflood installed
#   LOG_DIR [.]            where the tasks' output files go (slurm-seedflood-join-JOINJOB_J.out)
#   STORE_PORT [28400 + store job id % 1000]   must match the store job's
set -euo pipefail

# shellcheck source=launch/slurm/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"   # cd to the repo root; PYTHON, SEEDFLOOD_ROOT
unset SEEDFLOOD_STORE SEEDFLOOD_NODE   # the tasks find the store from STOREJOB

USAGE="usage: $0 [SBATCH_OPTION ...] STOREJOB N CONFIG.yaml --set churn.settle=1 --set churn.max_nodes=M [--set ...]"
OPTS=()
while [[ $# -gt 0 && $1 == -* ]]; do
    case $1 in
        --array* | -a* | --output* | -o* | --comment* | --dependency* | -d* | --job-name* | -J*)
            echo "$0: $1 is set by this script" >&2; exit 2 ;;
    esac
    OPTS+=("$1")
    shift
done
[[ $# -ge 3 ]] || { echo "$USAGE" >&2; exit 2; }
STORE=$1 N=$2 CONFIG=$3
shift 3
[[ $STORE =~ ^[0-9]+$ ]] || { echo "$0: STOREJOB '$STORE' is not a job id ($USAGE)" >&2; exit 2; }
[[ $N =~ ^[0-9]+$ ]] && (( N >= 1 )) || { echo "$0: N '$N' is not a count of new clients >= 1" >&2; exit 2; }
[[ -f $CONFIG ]] || { echo "$0: config file '$CONFIG' does not exist (paths are relative to $ROOT)" >&2; exit 2; }

# Preflight: the run's config, churn, and the ids it is open to (topology.nodes..max_nodes-1).
WORLD=$("$PYTHON" -m "${SEEDFLOOD_MODULE:-seedflood}" world-size --config "$CONFIG" "$@" --set checkpoint.resume=true) || exit $?
# shellcheck disable=SC2016
read -r SETTLE MAX < <("$PYTHON" -c 'import sys; from seedflood.core.config import runconfig; c = runconfig.load(sys.argv[1], [a for a in sys.argv[2:] if a != "--set"]).churn; print(c.settle, c.max_nodes or 0)' "$CONFIG" "$@") || exit 2
(( SETTLE >= 1 )) || { echo "$0: churn.settle is 0 (strict): new ids join churn runs only (pass the run's --set churn.settle=1)" >&2; exit 2; }
NODES=$(( WORLD - 1 ))
FIRST=${FIRST:-$NODES}
LAST=$(( FIRST + N - 1 ))
if (( MAX <= NODES )); then
    echo "$0: the run takes no new node ids (churn.max_nodes=$MAX, topology.nodes=$NODES): pass the run's --set churn.max_nodes=M, M > $NODES, as it was started with" >&2
    exit 2
elif (( FIRST < NODES || LAST >= MAX )); then
    echo "$0: new ids $FIRST..$LAST do not fit the run: it takes ids $NODES..$(( MAX - 1 )) (topology.nodes=$NODES, churn.max_nodes=$MAX)" >&2
    exit 2
fi
STATE=$(scontrol -o show job "$STORE" 2>/dev/null | sed -n 's/.*[[:space:]]JobState=\([^[:space:]]*\).*/\1/p' | head -n 1 || true)
[[ $STATE == RUNNING ]] || { echo "$0: store job $STORE is ${STATE:-unknown to SLURM}, not RUNNING: no run to join" >&2; exit 2; }

LOG_DIR=${LOG_DIR:-.}
JOIN=$(SEEDFLOOD_STORE_JOB=$STORE SEEDFLOOD_JOIN=1 sbatch --parsable "${OPTS[@]}" --array="$FIRST-$LAST" \
    --job-name=seedflood-join --comment="seedflood-store=$STORE" \
    --output="$LOG_DIR/slurm-%x-%A_%a.out" launch/slurm/churn.sbatch "$CONFIG" "$@")
JOIN=${JOIN%%;*}
echo "join=$JOIN"
cat >&2 <<EOF
$0: join job $JOIN (tasks $FIRST-$LAST: new node ids $FIRST..$LAST) against store job $STORE
  requeue node J:  scontrol requeue ${JOIN}_J
  stop them:       scancel $JOIN
EOF
