#!/usr/bin/env bash
# Build the folder a training call on the lent GPU machine carries (the workplace's `device` tool: at most 64 MiB
# per call, the tracked tree included), so that a session with a GPU starts training at once.
#
#   bash recipes/gpu_bundle.sh [DATA] [DEST]     # DATA: the shared corpus (../shared/data); DEST: .gpu
#
# DEST/data/speech, DEST/data/noise: Opus copies of DATA/speech/train and DATA/noise/train (recipes.compact_corpus,
# levels 0.9 and 0.9: about 21 and 10 MiB for the shared corpus; noise at 0.95, 6 MiB, measurably cost quality in
# sessions 28 and 31, recipes/README.md). DEST/whl: wheels of soundfile, cffi, pycparser and soxr (what the GPU
# image's Python lacks; recipes/remote_train.sh installs them) for CPython 3.12 on x86-64 Linux, at the versions
# installed here; NO_WHEELS=1 skips them. DEST/data/dev: every DEV_EVERY-th pair of DATA/dev, as it is; by default
# (DEV_EVERY=auto) every 4th if that fits, else the smallest stride whose pairs fit in what the rest leaves (the
# tracked tree grows: 25.1 MiB in session 12, 27.6 in session 33; with noise at 0.9 that leaves about 9 of the
# 120 pairs). Speech, noise and wheels already there are kept (compact_corpus skips done files, pip download
# overwrites with the same bytes), so running it again is cheap; the dev folder is made anew each time.
# Then prints the bundle's size and the tracked tree's against LIMIT_MIB, and exits 1 if they do not fit.
# Settings (environment): PYTHON (python), NO_WHEELS, LIMIT_MIB (62), SPEECH_LEVEL (0.9), NOISE_LEVEL (0.9),
# DEV_EVERY (auto, or a stride: 4 is every 4th pair). LIMIT_MIB is 62, not the tool's 64: the `device` tool
# refused a tree this script counted at 63.0 MiB (session 31; 62.0 and 61.9 passed), so it counts more than the
# files' bytes.
set -euo pipefail
DATA=${1:-../shared/data}
DEST=${2:-.gpu}
PYTHON=${PYTHON:-python}
for d in "$DATA/speech/train" "$DATA/noise/train" "$DATA/dev/noisy" "$DATA/dev/clean"; do
    [ -d "$d" ] || { echo "gpu_bundle: $d is not a folder (DATA must be a corpus laid out like ../shared/data)" >&2; exit 2; }
done

DEV_EVERY=${DEV_EVERY:-auto}
[[ "$DEV_EVERY" =~ ^([1-9][0-9]*|auto)$ ]] || { echo "gpu_bundle: DEV_EVERY must be a positive whole number or auto, not '$DEV_EVERY'" >&2; exit 2; }

"$PYTHON" -m recipes.compact_corpus "$DATA/speech/train" "$DEST/data/speech" --level "${SPEECH_LEVEL:-0.9}"
"$PYTHON" -m recipes.compact_corpus "$DATA/noise/train" "$DEST/data/noise" --level "${NOISE_LEVEL:-0.9}"

if [ -z "${NO_WHEELS:-}" ]; then
    mkdir -p "$DEST/whl"
    for pkg in soundfile cffi pycparser soxr; do
        version=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$pkg")
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/whl" "$pkg==$version"
    done
fi

tree=$(git ls-files -z | xargs -0 stat -c %s 2> /dev/null | awk '{ s += $1 } END { print s + 0 }')  # every batch xargs makes
limit=$(( ${LIMIT_MIB:-62} * 1024 * 1024 ))
rm -rf "$DEST/data/dev"
mkdir -p "$DEST/data/dev/noisy" "$DEST/data/dev/clean"
names=()
while IFS= read -r name; do
    [ -f "$DATA/dev/clean/$name" ] || { echo "gpu_bundle: $DATA/dev/clean/$name is missing" >&2; exit 2; }
    names+=("$name")
done < <(ls "$DATA/dev/noisy" | LC_ALL=C sort)
if [ "$DEV_EVERY" = auto ]; then  # every 4th, or the smallest larger stride whose pairs fit in what is left
    left=$(( limit - tree - $(du -sb "$DEST" | cut -f1) ))
    DEV_EVERY=$(for name in "${names[@]}"; do
        echo $(( $(stat -c %s "$DATA/dev/noisy/$name") + $(stat -c %s "$DATA/dev/clean/$name") ))
    done | awk -v left="$left" '{ size[NR - 1] = $1 } END {
        for (s = 4; s <= (NR > 4 ? NR : 4); s++) {
            t = 0; for (i = 0; i < NR; i += s) t += size[i]
            if (t <= left) { print s; exit }
        }
        print 0
    }')
    if [ "$DEV_EVERY" = 0 ]; then
        echo "gpu_bundle: no room for even one dev pair ($(( left / 1024 )) KiB left under the limit)" >&2
        DEV_EVERY=${#names[@]}  # one pair; the size check below says how far over
    fi
fi
n_dev=0
for i in "${!names[@]}"; do
    if [ $((i % DEV_EVERY)) -eq 0 ]; then
        cp "$DATA/dev/noisy/${names[$i]}" "$DEST/data/dev/noisy/"
        cp "$DATA/dev/clean/${names[$i]}" "$DEST/data/dev/clean/"
        n_dev=$((n_dev + 1))
    fi
done
echo "gpu_bundle: $n_dev of ${#names[@]} dev pairs copied (stride $DEV_EVERY)"

bundle=$(du -sb "$DEST" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu_bundle: $DEST $(mib "$bundle") + tracked tree $(mib "$tree") = $(mib $((bundle + tree))) of $(mib "$limit")"
if [ $((bundle + tree)) -gt "$limit" ]; then
    echo "gpu_bundle: too big to carry; raise the compression levels or copy fewer dev pairs" >&2
    exit 1
fi
