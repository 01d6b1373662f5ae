#!/usr/bin/env bash
# Build the folder a training call on the lent GPU machine carries (the workplace's `device` tool: at most 64 MiB
# per call, the tracked tree included), so that a session with a GPU starts training at once.
#
#   bash recipes/gpu_bundle.sh [DATA] [DEST]     # DATA: the shared corpus (../shared/data); DEST: .gpu
#
# DEST/data/speech, DEST/data/noise: Opus copies of DATA/speech/train and DATA/noise/train (recipes.compact_corpus,
# levels 0.9 and 0.95: about 22 and 6 MB for the shared corpus). DEST/data/dev: every 4th pair of DATA/dev, as it
# is (30 FLAC pairs, about 7 MB). DEST/whl: wheels of soundfile, cffi, pycparser and soxr (what the GPU image's
# Python lacks; recipes/remote_train.sh installs them) for CPython 3.12 on x86-64 Linux, at the versions installed
# here; NO_WHEELS=1 skips them. Files already there are kept (compact_corpus skips done files, the dev copy and
# pip download overwrite with the same bytes), so running it again is cheap.
# Then prints the bundle's size and the tracked tree's against LIMIT_MIB, and exits 1 if they do not fit.
# Settings (environment): PYTHON (python), NO_WHEELS, LIMIT_MIB (62), SPEECH_LEVEL (0.9), NOISE_LEVEL (0.95),
# DEV_EVERY (4: every 4th dev pair). The noise less coded, as session 31 trained (level 0.95 measurably cost
# quality, recipes/README.md): NOISE_LEVEL=0.9 DEV_EVERY=12 (9.9 MiB of noise, 10 dev pairs) into a fresh DEST
# (files already there are kept; raise DEV_EVERY as the tracked tree grows). LIMIT_MIB is 62, not the tool's
# 64: the `device` tool refused a tree this script counted at 63.0 MiB (session 31; 62.0 and 61.9 passed), so it
# counts more than the files' bytes.
set -euo pipefail
DATA=${1:-../shared/data}
DEST=${2:-.gpu}
PYTHON=${PYTHON:-python}
for d in "$DATA/speech/train" "$DATA/noise/train" "$DATA/dev/noisy" "$DATA/dev/clean"; do
    [ -d "$d" ] || { echo "gpu_bundle: $d is not a folder (DATA must be a corpus laid out like ../shared/data)" >&2; exit 2; }
done

DEV_EVERY=${DEV_EVERY:-4}
[[ "$DEV_EVERY" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_bundle: DEV_EVERY must be a positive whole number, not '$DEV_EVERY'" >&2; exit 2; }

"$PYTHON" -m recipes.compact_corpus "$DATA/speech/train" "$DEST/data/speech" --level "${SPEECH_LEVEL:-0.9}"
"$PYTHON" -m recipes.compact_corpus "$DATA/noise/train" "$DEST/data/noise" --level "${NOISE_LEVEL:-0.95}"

mkdir -p "$DEST/data/dev/noisy" "$DEST/data/dev/clean"
i=0
n_dev=0
while IFS= read -r name; do
    if [ $((i % DEV_EVERY)) -eq 0 ]; then
        [ -f "$DATA/dev/clean/$name" ] || { echo "gpu_bundle: $DATA/dev/clean/$name is missing" >&2; exit 2; }
        cp "$DATA/dev/noisy/$name" "$DEST/data/dev/noisy/"
        cp "$DATA/dev/clean/$name" "$DEST/data/dev/clean/"
        n_dev=$((n_dev + 1))
    fi
    i=$((i + 1))
done < <(ls "$DATA/dev/noisy" | LC_ALL=C sort)
echo "gpu_bundle: $n_dev of $i dev pairs copied"

if [ -z "${NO_WHEELS:-}" ]; then
    mkdir -p "$DEST/whl"
    for pkg in soundfile cffi pycparser soxr; do
        version=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$pkg")
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/whl" "$pkg==$version"
    done
fi

bundle=$(du -sb "$DEST" | cut -f1)
tree=$(git ls-files -z | xargs -0 stat -c %s 2> /dev/null | awk '{ s += $1 } END { print s + 0 }')  # every batch xargs makes
limit=$(( ${LIMIT_MIB:-62} * 1024 * 1024 ))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu_bundle: $DEST $(mib "$bundle") + tracked tree $(mib "$tree") = $(mib $((bundle + tree))) of $(mib "$limit")"
if [ $((bundle + tree)) -gt "$limit" ]; then
    echo "gpu_bundle: too big to carry; raise the compression levels or copy fewer dev pairs" >&2
    exit 1
fi
