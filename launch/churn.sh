#!/usr/bin/env bash
# Launch one churn-tolerant SeedFlood run on this machine: one torchrun agent per process, so a
# process that fails is restarted alone (MAX_RESTARTS) and rejoins by replay while the others
# train on; the rendezvous store runs in its own process (`seedflood store`), so the evaluator
# may fail and restart too (launch/README.md, docs/churn.md).
#
#   launch/churn.sh launch/configs/debug.yaml --set churn.settle=1 [--set section.field=value ...]
#
# Environment (defaults in brackets):
#   PYTHON [<repo>/.venv/bin/python if it exists, else python3]   interpreter with seedflood installed
#   MAX_RESTARTS [3]        torchrun --max-restarts of each process's own agent
#   STORE_PORT [a free port]  where `seedflood store` listens (127.0.0.1)
#   LOG_SERVER_PORT []      set: a `seedflood serve-log` of run.out_dir listens there (127.0.0.1) and
#                           every process gets churn.log_server, so a restarted one takes the decided
#                           prefix from it and its sponsor sends only the steps after (docs/churn.md)
#
# The config must have churn.settle >= 1 (checked first). Exit status: the evaluator's (rank 0).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $REPO/.venv/bin/python ]]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
MAX_RESTARTS=${MAX_RESTARTS:-3}

[[ $# -ge 1 && $1 != -* ]] || { echo "usage: $0 CONFIG.yaml [--set section.field=value ...]" >&2; exit 2; }
CONFIG=$1
shift
[[ -f $CONFIG ]] || { echo "$0: config file '$CONFIG' does not exist" >&2; exit 2; }

WORLD=$("$PYTHON" -m seedflood world-size --config "$CONFIG" "$@") || exit $?
read -r SETTLE OUT_DIR < <("$PYTHON" -c 'import sys; from seedflood.core.config import runconfig; c = runconfig.load(sys.argv[1], [a for a in sys.argv[2:] if a != "--set"]); print(c.churn.settle, c.run.out_dir)' "$CONFIG" "$@")
(( SETTLE >= 1 )) || { echo "$0: churn.settle is 0 (strict): pass --set churn.settle=1 (or use launch/torchrun.sh)" >&2; exit 2; }
STORE_PORT=${STORE_PORT:-$("$PYTHON" -c 'from seedflood.comm.runtime import free_port; print(free_port())')}

"$PYTHON" -m seedflood store --host 127.0.0.1 --port "$STORE_PORT" &
STORE_PID=$!
AGENTS=()
LOG_SERVER=()
cleanup() { kill "${AGENTS[@]}" "$STORE_PID" "${LOG_SERVER[@]}" 2>/dev/null || true; }
trap cleanup EXIT
if [[ -n ${LOG_SERVER_PORT:-} ]]; then
    "$PYTHON" -m seedflood serve-log "$OUT_DIR" --host 127.0.0.1 --port "$LOG_SERVER_PORT" &
    LOG_SERVER=($!)
    set -- "$@" --set "churn.log_server=127.0.0.1:$LOG_SERVER_PORT"
fi

for (( r = 0; r < WORLD; r++ )); do
    SEEDFLOOD_RANK=$r SEEDFLOOD_WORLD_SIZE=$WORLD SEEDFLOOD_LOCAL_WORLD_SIZE=$WORLD \
    SEEDFLOOD_STORE=127.0.0.1:$STORE_PORT \
        "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=1 --max-restarts="$MAX_RESTARTS" \
        -m seedflood train --config "$CONFIG" "$@" &
    AGENTS+=($!)
done
STATUS=0
wait "${AGENTS[0]}" || STATUS=$?        # the evaluator's agent: the run's result
for pid in "${AGENTS[@]:1}"; do wait "$pid" || true; done
exit "$STATUS"
