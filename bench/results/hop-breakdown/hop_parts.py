"""Session 28: where one streaming hop's time goes around the step (bench/README.md, "Where the time goes").

    python bench/results/hop-breakdown/hop_parts.py onnxruntime-int8    # from the repository root

Wraps the engine's parts with timers and prints each one's milliseconds per hop over 1,000 one-hop calls.
"""

import collections
import sys
import time

import numpy as np
import torch

import enhance.streaming as S
from enhance.backends import streaming_backend
from models.pretrained import load_pretrained

torch.set_num_threads(1)

name = sys.argv[1]
model = load_pretrained("default").model
be = streaming_backend(model, name)
acc = collections.Counter()


def wrap(mod, fname, key=None):
    f = getattr(mod, fname)

    def w(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        acc[key or fname] += time.perf_counter() - t
        return r

    setattr(mod, fname, w)


for fn in (
    "sample_value_error",
    "analysis_frames",
    "log_magnitude",
    "apply_magnitude",
    "synthesis_frames",
    "overlap_add",
    "block_dc",
):
    wrap(S, fn)
wrap(be, "step", "backend.step")
E = S.StreamingEnhancer
for m in ("_block_dc", "_emit", "_keep_competition", "_advance", "process"):
    wrap(E, m, "E." + m)
eng = E(model, backend=be)
rng = np.random.default_rng(0)
audio = (0.05 * rng.standard_normal((1, 256 * 1500))).astype(np.float32)
for i in range(0, 256 * 200, 256):
    eng.process(audio[:, i : i + 256])
acc.clear()
N = 1000
for i in range(256 * 200, 256 * (200 + N), 256):
    eng.process(audio[:, i : i + 256])
for k, v in acc.most_common():
    print(f"{k:22s} {v / N * 1e3:.3f} ms")
