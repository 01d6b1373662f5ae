"""Session 34 one-off probe: PyTorch's Static Runtime (``torch._C._jit_to_static_module``, the TorchScript
interpreter built for low per-operation overhead in CPU inference: out-variant kernels, planned memory) on the
traced one-frame step, against the frozen, optimised traced step that the ``torchscript`` backend runs. Run from
the repository root, one thread, nothing else running:

    PYTHONPATH=. python bench/results/torchscript-probes/static_runtime.py > bench/results/torchscript-probes/static_runtime.txt

Checks the outputs equal, then times both alternately (ms per one-frame call, fastest of 5 batches of 200 calls,
per round, 9 rounds, the first of each pair alternating) and prints each round and the median of the per-round
ratios static / traced.
"""

import copy
import statistics
import time

import torch

from models.pretrained import load_pretrained
from models.static_step import StaticStep

torch.set_num_threads(1)


def fastest(fn, calls: int = 200, batches: int = 5) -> float:
    with torch.inference_mode():
        for _ in range(30):
            fn()
        best = 1e9
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e3


model = load_pretrained("default").model.float().eval()
step = StaticStep(copy.deepcopy(model)).eval()
names = [n for n, _ in step.state_shapes(1)]
ex2 = [torch.zeros(1, 2, 257)] + [torch.zeros(s) for _, s in step.state_shapes(1, frames=2)]
g = torch.Generator().manual_seed(0)
feed = [torch.rand(1, 1, 257, generator=g)] + [
    torch.randn(s, generator=g) * 0.1 for _, s in step.state_shapes(1, frames=1)
]
feed[1 + names.index("mask")].zero_()
with torch.no_grad():
    frozen = torch.jit.freeze(torch.jit.trace(step, tuple(ex2), check_trace=False).eval())
    traced = torch.jit.optimize_for_inference(copy.deepcopy(frozen))
static = torch._C._jit_to_static_module(frozen._c)  # the frozen graph (the optimised one measured the same)
with torch.inference_mode():
    ref, out = traced(*feed), static(*feed)
diff = max(float((a - b).abs().max()) for a, b in zip(ref, out, strict=True))
print(f"outputs: {len(ref)} tensors, largest difference {diff:.3g}")
ratios = []
for r in range(9):
    pair = [("traced", traced), ("static", static)]
    if r % 2:
        pair.reverse()
    times = {name: fastest(lambda m=m: m(*feed)) for name, m in pair}
    ratios.append(times["static"] / times["traced"])
    print(
        f"round {r}: traced {times['traced']:.3f} ms, static {times['static']:.3f} ms, ratio {ratios[-1]:.3f}"
    )
print(
    f"median ratio static / traced: {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})"
)
