#!/usr/bin/env bash
# Train on a machine lent for a fixed time, handing results back in parts (the workplace's `device` tool).
#
#   bash recipes/remote_train.sh start MINUTES [tim-train flags...]  # install carried wheels, start a detached run
#   bash recipes/remote_train.sh wait  SECONDS                       # watch it; copy results to $OUT
#
# `start` installs the wheels in .gpu/whl (soundfile, cffi, pycparser, soxr: what that machine's Python lacks),
# starts `python -m recipes.train ... --out $RUN --time-budget-minutes MINUTES` in its own process session (it
# outlives the call; the next call must come while the machine is still warm), then waits like `wait`.
# `wait` returns after SECONDS or when the run has ended, and copies the run's config, environment, metrics, log and
# checkpoints to $OUT, checkpoints split into 15 MiB parts (join with `cat best.safetensors.part-* > ...`).
# state.pt (model + Adam state, 71 MB for the default model) does not fit in what a call hands back (64 MiB):
# --resume works while the same machine stays warm; after that, continue with --init-from (a fresh optimizer).
#
# Settings (environment): RUN (the run folder, /tmp/tim-run), WORK (log, pid and wheel site, /tmp), PYTHON
# (python3), START_WAIT (seconds `start` waits before its first look, 60), WAIT_SECONDS (how long `start` then
# watches, 420), OUT (where results go; the device tool sets it).
set -euo pipefail
RUN=${RUN:-/tmp/tim-run}
WORK=${WORK:-/tmp}
PYTHON=${PYTHON:-python3}
SITE=$WORK/site
LOG=$WORK/train.log
PID=$WORK/train.pid
cmd=${1:-}; [ $# -gt 0 ] && shift

collect() {
    mkdir -p "$OUT"
    for f in config.json env.json metrics.csv; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/" || true; done
    [ -f "$LOG" ] && tail -c 1000000 "$LOG" > "$OUT/train.log" || true
    for ck in best last; do
        [ -f "$RUN/$ck.safetensors" ] || continue
        split -b 15M -d "$RUN/$ck.safetensors" "$OUT/$ck.safetensors.part-"
    done
}

watch() {
    local until=$(( $(date +%s) + $1 ))
    while [ "$(date +%s)" -lt "$until" ]; do
        if ! kill -0 "$(cat "$PID")" 2> /dev/null; then echo "[remote] run ended"; break; fi
        sleep 10
    done
    grep -E "^\[train\] (epoch [0-9]+:|stopped|skipped)|Error|error" "$LOG" | tail -n 60 || true
    tail -n 3 "$LOG" || true
    collect
}

case "$cmd" in
start)
    minutes=$1; shift
    if compgen -G ".gpu/whl/*.whl" > /dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .gpu/whl/*.whl
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null || true
    : > "$LOG"  # there before the first look (the background run opens it when it gets to it)
    PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 setsid nohup "$PYTHON" -m recipes.train --out "$RUN" \
        --time-budget-minutes "$minutes" "$@" >> "$LOG" 2>&1 < /dev/null &
    echo $! > "$PID"
    sleep "${START_WAIT:-60}"
    tail -n 20 "$LOG"
    watch "${WAIT_SECONDS:-420}"
    ;;
wait)
    watch "${1:?wait needs SECONDS}"
    ;;
*)
    echo "usage: $0 start MINUTES [flags] | wait SECONDS" >&2
    exit 2
    ;;
esac
