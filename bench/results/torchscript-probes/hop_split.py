"""Session 31 probe: where a 16-ms hop's time goes in the streaming engine with a TorchScript backend. The engine
(`StreamingEnhancer`) is fed 30 s of white noise in 16-ms chunks, one thread; the backend's methods are wrapped
with timers: `step()` (the host's bookkeeping plus the traced module), the traced module's calls alone,
`_keep_new` (new k/v into the rings) and `_mask`. "outside step" is the engine's NumPy signal path and Python
around it. One pass after a 1-s warm-up; the shared VM drifts, so read the parts as sizes. Run from the
repository root:

    python bench/results/torchscript-probes/hop_split.py torchscript-int8 torchscript torchscript-int8
    # output: hop_split.txt
"""

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from enhance.backends import streaming_backend
from enhance.streaming import StreamingEnhancer
from models.pretrained import load_pretrained

torch.set_num_threads(1)


def split(kind: str) -> str:
    ck = load_pretrained()
    backend = streaming_backend(ck.model, kind, threads=1)
    spent = {"module": 0.0, "keep": 0.0, "mask": 0.0, "step": 0.0}

    def timed(key: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            result = f(*args, **kwargs)
            spent[key] += time.perf_counter() - t
            return result

        return wrapper

    backend.run = timed("module", backend.run)
    backend._keep_new = timed("keep", backend._keep_new)
    backend._mask = timed("mask", backend._mask)
    backend.step = timed("step", backend.step)
    engine = StreamingEnhancer(ck.model, backend=backend)
    x = (0.1 * np.random.default_rng(0).standard_normal(16000 * 30)).astype(np.float32)
    for i in range(0, 16000, 256):  # warm-up
        engine.process(x[None, i : i + 256])
    engine.reset()
    spent.update(dict.fromkeys(spent, 0.0))
    hops = 0
    t0 = time.perf_counter()
    for i in range(0, len(x) - 255, 256):
        engine.process(x[None, i : i + 256])
        hops += 1
    total = time.perf_counter() - t0
    ms = {k: 1e3 * v / hops for k, v in spent.items()}
    return (
        f"| {kind} | {1e3 * total / hops:.3f} | {total / (hops * 0.016):.3f} | {ms['step']:.3f} | "
        f"{ms['module']:.3f} | {ms['keep']:.3f} | {ms['mask']:.3f} | {1e3 * total / hops - ms['step']:.3f} |"
    )


if __name__ == "__main__":
    print(
        "| backend | ms per hop | real-time factor | step() | traced module | _keep_new | _mask | outside step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind in sys.argv[1:] or ["torchscript-int8", "torchscript"]:
        print(split(kind), flush=True)
