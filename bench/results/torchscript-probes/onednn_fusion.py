"""Session 30 one-off probe: TorchScript's oneDNN Graph fuser (torch.jit.enable_onednn_fusion) on the traced step, which
would merge products with their adds and activations. Run from the repository root:

    PYTHONPATH=. python bench/results/torchscript-probes/onednn_fusion.py 1    # with the fuser
    PYTHONPATH=. python bench/results/torchscript-probes/onednn_fusion.py 0    # the backend's frozen, optimised step

Output of both (torch 2.13.0+cpu, AMD EPYC with AVX-512): onednn_fusion.txt. The fuser fails on the step.
"""
# ruff: noqa: E402

import copy
import sys
import time

import torch

torch.set_num_threads(1)
fuse = sys.argv[1] == "1"
if fuse:
    torch.jit.enable_onednn_fusion(True)
from models.pretrained import load_pretrained
from models.static_step import StaticStep

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
    tr = torch.jit.trace(step, tuple(ex2), check_trace=False)
    m = torch.jit.freeze(tr.eval())
    if not fuse:
        m = torch.jit.optimize_for_inference(m)
ref = step(*feed)
with torch.no_grad():
    for _ in range(5):
        out = m(*feed)  # profiling runs
print("diff", max(float((a - b).abs().max()) for a, b in zip(ref, out, strict=True)))
print("graph", torch.jit.last_executed_optimized_graph().str().count("LlgaFusionGroup") if fuse else "")


def timeit(calls=200, batches=7):
    with torch.no_grad():
        best = 1e9
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(calls):
                m(*feed)
            best = min(best, (time.perf_counter() - t) / calls)
    return best


print("fuse" if fuse else "ofi", " ".join(f"{timeit() * 1e3:.3f}" for _ in range(3)))
