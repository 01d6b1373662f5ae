"""Session 28: the fused per-frame path for the TorchScript/onnxruntime steps against the engine's general path.

    git apply bench/results/hop-breakdown/fused_run_frames.patch     # the path tried (not kept)
    python bench/results/hop-breakdown/fused_ab.py torchscript onnxruntime-int8 onnxruntime
    git checkout enhance/fixed_step.py

Prints the largest sample difference and the fastest of 7 interleaved rounds of 300 one-hop calls per path.
"""

import sys
import time

import numpy as np
import torch

from enhance.backends import streaming_backend
from enhance.streaming import StreamingEnhancer
from models.pretrained import load_pretrained

torch.set_num_threads(1)

model = load_pretrained("default").model
rng = np.random.default_rng(0)
audio = (0.05 * rng.standard_normal((1, 256 * 1500))).astype(np.float32)
for name in sys.argv[1:]:
    be = streaming_backend(model, name)

    def make(fused, be=be):
        e = StreamingEnhancer(model, backend=be)
        if not fused:
            e._run_frames = None
            e.reset()
        return e

    a = np.concatenate(
        [
            make(False).process(audio),
        ],
        axis=1,
    )
    b = make(True).process(audio)
    res = {False: [], True: []}
    for _ in range(7):
        for fused in (False, True):
            eng = make(fused)
            for i in range(0, 256 * 50, 256):
                eng.process(audio[:, i : i + 256])
            t = time.perf_counter()
            for i in range(256 * 50, 256 * 350, 256):
                eng.process(audio[:, i : i + 256])
            res[fused].append((time.perf_counter() - t) / 300 * 1e3)
    g, f = min(res[False]), min(res[True])
    print(
        f"{name}: max diff {np.abs(a - b).max():.2e}; general path {g:.3f} ms/hop, run_frames {f:.3f} ({f / g:.3f}x); medians {sorted(res[False])[3]:.3f} / {sorted(res[True])[3]:.3f}"
    )
