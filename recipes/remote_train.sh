#!/usr/bin/env bash
# Train on a machine lent for a fixed time, handing results back in parts (the workplace's `device` tool).
#
#   bash recipes/remote_train.sh start MINUTES [tim-train flags...]  # install carried wheels, start a detached run
#   bash recipes/remote_train.sh wait  SECONDS                       # watch it; copy results to $OUT
#   bash recipes/remote_train.sh snaps MINUTES [tim-train flags...]  # one call: a fine-tune, many epochs back
#
# `start` installs the wheels in .gpu/whl (soundfile, cffi, pycparser, soxr: what that machine's Python lacks),
# starts `python -m recipes.train ... --out $RUN --time-budget-minutes MINUTES` in its own process session (it
# outlives the call; the next call must come while the machine is still warm), then waits like `wait`.
# `wait` returns after SECONDS or when the run has ended, and copies the run's config, environment, metrics, log and
# checkpoints to $OUT, checkpoints split into 15 MiB parts (join with `cat best.safetensors.part-* > ...`).
# state.pt (model + Adam state, 71 MB for the default model) does not fit in what a call hands back (64 MiB):
# --resume works while the same machine stays warm; after that, continue with --init-from (a fresh optimizer).
#
# `snaps` is for a session's one call: it starts the run as `start` does (the flags must include --init-from BASE;
# to go on with `--resume` on the still-warm machine, give BASE=... in the environment instead),
# and after every epoch writes that epoch's weights as a float16 difference from BASE (recipes.checkpoint_delta:
# 11.8 MB for the default model instead of 23.6), so that more epochs fit in what a call hands back. When the run
# ends (or after WAIT_SECONDS), $OUT gets run.tar.gz (config, environment, metrics, log) and the deltas of at most
# MAX_SNAPS (5) epochs: the last and evenly spaced earlier ones. Decode here with
# `python -m recipes.checkpoint_delta decode BASE epN.delta epN.safetensors`.
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

init_from() {  # the --init-from BASE among the flags (--init-from=BASE too), or nothing
    local prev=""
    for a in "$@"; do
        [ "$prev" = "--init-from" ] && echo "$a"
        case "$a" in --init-from=*) echo "${a#--init-from=}" ;; esac
        prev=$a
    done
}

snaps() {
    local base
    base=${BASE:-$(init_from "$@" | tail -n 1)}
    local snapdir=$WORK/snaps done_rows=0 until=$(( $(date +%s) + ${WAIT_SECONDS:-420} ))
    mkdir -p "$snapdir" "$OUT"
    rm -f "$snapdir"/ep*.delta  # an earlier call's, already handed back
    while :; do
        local alive=1
        kill -0 "$(cat "$PID")" 2> /dev/null || alive=0
        local rows=0
        [ -f "$RUN/metrics.csv" ] && rows=$(( $(wc -l < "$RUN/metrics.csv") - 1 ))
        if [ "$rows" -gt "$done_rows" ]; then  # last.safetensors is saved before the epoch's CSV row
            local ep
            ep=$(tail -n 1 "$RUN/metrics.csv" | cut -d, -f1)
            PYTHONPATH="$SITE:$PWD" "$PYTHON" -m recipes.checkpoint_delta encode "$base" "$RUN/last.safetensors" \
                "$snapdir/ep$ep.delta" && echo "[remote] epoch $ep kept"
            done_rows=$rows
        fi
        [ "$alive" = 1 ] && [ "$(date +%s)" -lt "$until" ] || break
        sleep 3
    done
    grep -E "^\[train\] (epoch [0-9]+:|stopped|skipped)|Error|error" "$LOG" | tail -n 40 || true
    local info=()  # what the run wrote of these (none, if it failed before making its folder)
    for f in config.json env.json metrics.csv; do [ -f "$RUN/$f" ] && info+=(-C "$RUN" "$f"); done
    tar -czf "$OUT/run.tar.gz" "${info[@]}" -C "$WORK" train.log
    local kept picks
    kept=$(ls "$snapdir" | sed 's/^ep\([0-9]*\)\.delta$/\1/' | sort -n)
    picks=$(echo "$kept" | "$PYTHON" -c "
import sys
eps = [int(x) for x in sys.stdin.read().split()]
k = min(int(sys.argv[1]), len(eps))
n = len(eps)  # the last epoch, then evenly back to the first
print(' '.join(map(str, sorted({eps[n - 1 - round(i * (n - 1) / max(k - 1, 1))] for i in range(k)}))))
" "${MAX_SNAPS:-5}")
    for ep in $picks; do cp "$snapdir/ep$ep.delta" "$OUT/"; done
    if [ -z "$picks" ]; then
        echo "[remote] no epoch finished: no weights to hand back (the log is in run.tar.gz)" >&2
        exit 1
    fi
    ls -l "$OUT"
}

case "$cmd" in
start | snaps)
    minutes=$1; shift
    if [ "$cmd" = snaps ] && [ -z "${BASE:-}" ] && [ -z "$(init_from "$@")" ]; then
        echo "remote_train: snaps needs --init-from BASE, or BASE=... for a --resume (the deltas are differences from it)" >&2
        exit 2
    fi
    if compgen -G ".gpu/whl/*.whl" > /dev/null; then
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .gpu/whl/*.whl
    fi
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2> /dev/null || true
    mkdir -p "$WORK"
    : > "$LOG"  # there before the first look (the background run opens it when it gets to it)
    PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1 setsid nohup "$PYTHON" -m recipes.train --out "$RUN" \
        --time-budget-minutes "$minutes" "$@" >> "$LOG" 2>&1 < /dev/null &
    echo $! > "$PID"
    if [ "$cmd" = snaps ]; then
        snaps "$@"
    else
        sleep "${START_WAIT:-60}"
        tail -n 20 "$LOG"
        watch "${WAIT_SECONDS:-420}"
    fi
    ;;
wait)
    watch "${1:?wait needs SECONDS}"
    ;;
*)
    echo "usage: $0 start MINUTES [flags] | wait SECONDS | snaps MINUTES [flags]" >&2
    exit 2
    ;;
esac
