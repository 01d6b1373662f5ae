"""Session 34 one-off probe, the second half of static_runtime.py: the streaming engine per 16-ms hop with the
``torchscript`` backend's traced step against the same step run by PyTorch's Static Runtime, alternately in one
process (10 s of noise in 256-sample chunks per run, 7 rounds, the first of each pair alternating). Run from the
repository root, one thread, nothing else running:

    PYTHONPATH=. python bench/results/torchscript-probes/static_runtime_engine.py 2>/dev/null

(stderr holds Static Runtime's warnings that it resized its planned outputs: the engine calls the step with one
frame or two.)
"""

import copy
import statistics
import time

import numpy as np
import torch

from enhance.fixed_step import TracedStepper
from enhance.streaming import StreamingEnhancer
from models.pretrained import load_pretrained
from models.static_step import StaticStep

torch.set_num_threads(1)
model = load_pretrained("default").model.float().eval()
traced = TracedStepper(model)
static = TracedStepper(model)
step = StaticStep(copy.deepcopy(model)).eval()
example = [torch.zeros(1, 2, 257)] + [torch.zeros(s) for _, s in step.state_shapes(1, frames=2)]
with torch.no_grad():
    frozen = torch.jit.freeze(torch.jit.trace(step, tuple(example), check_trace=False).eval())
static.module = torch._C._jit_to_static_module(frozen._c)

x = (np.random.default_rng(0).standard_normal((1, 160_000)) * 0.05).astype(np.float32)


def run(backend: TracedStepper) -> tuple[float, np.ndarray]:
    engine = StreamingEnhancer(model, 1, backend=backend)
    t = time.perf_counter()
    ys = [engine.process(x[:, i : i + 256]) for i in range(0, x.shape[1], 256)]
    ys.append(engine.flush())
    return (time.perf_counter() - t) / 10.0, np.concatenate(ys, axis=1)


ratios = []
for r in range(7):
    pair = [("traced", traced), ("static", static)]
    if r % 2:
        pair.reverse()
    res = {name: run(b) for name, b in pair}
    ratios.append(res["static"][0] / res["traced"][0])
    diff = np.abs(res["traced"][1] - res["static"][1]).max()
    print(
        f"round {r}: real-time factor traced {res['traced'][0]:.4f}, static {res['static'][0]:.4f}, "
        f"ratio {ratios[-1]:.3f}, largest sample difference {diff:.2g}",
        flush=True,
    )
print(f"median ratio static / traced: {statistics.median(ratios):.3f}")
