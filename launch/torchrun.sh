#!/usr/bin/env bash
# Launch one SeedFlood run with torchrun: the evaluator (rank 0) plus topology.nodes clients.
#
# Single node (all processes here, c10d rendezvous on a free local port):
#   launch/torchrun.sh launch/configs/debug.yaml [--set section.field=value ...]
# Multi node (run on every node; NODE_RANK 0..NNODES-1; the endpoint is a host:port on node 0):
#   NNODES=2 NODE_RANK=0 RDZV_ENDPOINT=node0:29400 launch/torchrun.sh launch/configs/debug.yaml
#   NNODES=2 NODE_RANK=1 RDZV_ENDPOINT=node0:29400 launch/torchrun.sh launch/configs/debug.yaml
#
# Environment (defaults in brackets):
#   PYTHON [<repo>/.venv/bin/python if it exists (what `make install` creates), else python3, else python]
#                            interpreter with seedflood installed
#   NNODES [1]               machines taking part; 1 = torchrun --standalone
#   NODE_RANK [0]            this machine's index; decides its share of the processes
#   NPROC_PER_NODE []        processes here; empty = this node's share of clients + evaluator,
#                            i.e. (topology.nodes + 1) / NNODES, the remainder going to the first nodes
#   RDZV_ENDPOINT [localhost:29400]  c10d rendezvous host:port (multi node)
#   RDZV_ID [seedflood]      rendezvous id, the same on every node of one run
#   MAX_RESTARTS [0]         torchrun --max-restarts: restart the whole group this often on a failure;
#                            restarted processes resume from run.out_dir/checkpoints/latest
#   SEEDFLOOD_MODULE [seedflood]  Python module run by every process (`-m MODULE train ...`)
#   TORCHRUN_ARGS []         extra torchrun arguments, word-split
#
# Before any process starts, `$PYTHON -m $SEEDFLOOD_MODULE world-size` checks the config with the
# same overrides (always, also when NPROC_PER_NODE is given); a bad config, topology, task or model
# stops here with its one-line message and its exit status (2).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
default_python() {
    local venv=$REPO/.venv/bin/python
    if [[ -x $venv ]]; then echo "$venv"
    elif command -v python3 >/dev/null 2>&1; then echo python3
    else echo python
    fi
}
PYTHON=${PYTHON:-$(default_python)}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
NPROC_PER_NODE=${NPROC_PER_NODE:-}
RDZV_ENDPOINT=${RDZV_ENDPOINT:-localhost:29400}
RDZV_ID=${RDZV_ID:-seedflood}
MAX_RESTARTS=${MAX_RESTARTS:-0}
SEEDFLOOD_MODULE=${SEEDFLOOD_MODULE:-seedflood}
TORCHRUN_ARGS=${TORCHRUN_ARGS:-}

usage() { echo "usage: $0 CONFIG.yaml [--set section.field=value ...]" >&2; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
CONFIG=$1
shift
[[ -f $CONFIG ]] || { echo "$0: config file '$CONFIG' does not exist" >&2; exit 2; }
[[ $NNODES =~ ^[1-9][0-9]*$ && $NODE_RANK =~ ^[0-9]+$ && $NODE_RANK -lt $NNODES ]] ||
    { echo "$0: need NNODES >= 1 and 0 <= NODE_RANK < NNODES (got NNODES=$NNODES NODE_RANK=$NODE_RANK)" >&2; exit 2; }

# Preflight: world size = clients + evaluator, from the config and the same overrides the run gets.
# Its stderr (the one-line error) passes through; its status is ours.
WORLD=$("$PYTHON" -m "$SEEDFLOOD_MODULE" world-size --config "$CONFIG" "$@") || exit $?
[[ $WORLD =~ ^[0-9]+$ ]] || { echo "$0: world-size printed '$WORLD'" >&2; exit 2; }
if [[ -z $NPROC_PER_NODE ]]; then
    NPROC_PER_NODE=$(( WORLD / NNODES + (NODE_RANK < WORLD % NNODES ? 1 : 0) ))
    (( NPROC_PER_NODE >= 1 )) || { echo "$0: $WORLD processes cannot fill $NNODES nodes" >&2; exit 2; }
elif ! [[ $NPROC_PER_NODE =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: NPROC_PER_NODE must be an integer >= 1 (got '$NPROC_PER_NODE')" >&2; exit 2
fi

if (( NNODES == 1 )); then
    RDZV=(--standalone)
else
    RDZV=(--nnodes="$NNODES" --node-rank="$NODE_RANK" --rdzv-backend=c10d
          --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID")
fi

# shellcheck disable=SC2206  # TORCHRUN_ARGS is deliberately word-split
EXTRA=($TORCHRUN_ARGS)
set -x
exec "$PYTHON" -m torch.distributed.run "${RDZV[@]}" --nproc-per-node="$NPROC_PER_NODE" \
    --max-restarts="$MAX_RESTARTS" "${EXTRA[@]}" -m "$SEEDFLOOD_MODULE" train --config "$CONFIG" "$@"
