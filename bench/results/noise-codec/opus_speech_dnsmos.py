"""Session 28: does DNSMOS score the GPU bundle's Opus speech like the FLAC originals? (recipes/README.md)

    bash recipes/gpu_bundle.sh ../shared/data .gpu && python bench/results/noise-codec/opus_speech_dnsmos.py

30 random files of speech/train (seed 0): mean DNSMOS of each version, and PESQ-wb of the copy.
"""

import random
import statistics
from pathlib import Path

import soundfile as sf

from recipes.metrics import DNSMOS, pesq_wb

random.seed(0)
flacs = sorted(Path("../shared/data/speech/train").rglob("*.flac"))
pick = random.sample(flacs, 30)
d = DNSMOS()
res = {"flac": [], "opus": []}
pq = []
for f in pick:
    rel = f.relative_to("../shared/data/speech/train").with_suffix(".ogg")
    o = Path(".gpu/data/speech") / rel
    a, _ = sf.read(f, dtype="float32")
    b, _ = sf.read(o, dtype="float32")
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    res["flac"].append(d(a))
    res["opus"].append(d(b))
    pq.append(pesq_wb(a, b))
for k in res:
    print(k, {m: round(statistics.mean(r[m] for r in res[k]), 3) for m in res[k][0]})
print("pesq opus vs flac", round(statistics.mean(pq), 3), min(pq))
