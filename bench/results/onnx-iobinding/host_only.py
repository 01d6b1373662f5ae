"""Session 29: where a 16-ms hop of onnxruntime-int8 went before the bound one-frame calls. Run it on the code
before them (commit d1eff4b), from this repository's root:

    git worktree add /tmp/before d1eff4b
    PYTHONPATH=/tmp/before python bench/results/onnx-iobinding/host_only.py

Times, alternating over 7 rounds (fastest kept), a 10-s test signal fed in 16-ms chunks: the engine; the
engine with the step's outputs replayed from a cache (the onnxruntime session not run: the host alone); and the
one-frame session alone in a loop, 625 calls (the same number of steps). On the current code the replay does not
apply (one-frame calls no longer go through ``run``), so the second row would be wrong there.
"""

import os
import sys
import time
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"
sys.path.append(str(Path(__file__).resolve().parents[2]))  # bench/, after PYTHONPATH's checkout

import numpy as np
import torch
from bench_streaming import test_signal

from enhance.backends import streaming_backend
from enhance.streaming import StreamingEnhancer
from models.pretrained import load_pretrained

torch.set_num_threads(1)
model = load_pretrained("default").model
backend = streaming_backend(model, "onnxruntime-int8")
x = test_signal(10.0)[None]
engine = StreamingEnhancer(model, backend=backend)
real_run = backend.run
cache: dict[int, list[torch.Tensor]] = {}


def replayed(feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    n = feed["feat"].shape[1]
    if n not in cache:
        cache[n] = [t.clone() for t in real_run(feed)]
    return cache[n]


def engine_rtf() -> float:
    engine.reset()
    t0 = time.perf_counter()
    for i in range(0, x.shape[1], 256):
        engine.process(x[:, i : i + 256])
    engine.flush()
    return (time.perf_counter() - t0) / 10.0


session = backend.one_frame_session
feed = {
    i.name: np.zeros([1 if isinstance(d, str) else d for d in i.shape], np.float32)
    for i in session.get_inputs()
}


def session_alone() -> float:
    t0 = time.perf_counter()
    for _ in range(625):
        session.run(None, feed)
    return (time.perf_counter() - t0) / 10.0


engine_rtf()
rows: dict[str, list[float]] = {"engine": [], "host alone (step outputs replayed)": [], "session alone": []}
for _ in range(7):
    backend.run = real_run
    rows["engine"].append(engine_rtf())
    backend.run = replayed
    rows["host alone (step outputs replayed)"].append(engine_rtf())
    rows["session alone"].append(session_alone())
print("| part | real-time factor | ms per 16-ms hop |\n|---|---|---|")
for name, values in rows.items():
    print(f"| {name} | {min(values):.4f} | {min(values) * 16:.3f} |")
