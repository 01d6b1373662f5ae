"""Session 30 one-off probes of TorchScript's fixed costs (bench/README.md, "Why 0.10 per hop is out of reach").
Run from the repository root, one thread, nothing else running:

    PYTHONPATH=. python bench/results/torchscript-probes/executor_and_op_costs.py ops        # cost per graph node
    PYTHONPATH=. python bench/results/torchscript-probes/executor_and_op_costs.py default    # the traced step
    PYTHONPATH=. python bench/results/torchscript-probes/executor_and_op_costs.py legacy     # the legacy executor
    PYTHONPATH=. python bench/results/torchscript-probes/executor_and_op_costs.py onednn     # oneDNN Graph fuser

``ops``: microseconds per repetition of a trivial node pattern in a frozen, optimised traced graph (200
repetitions against none): a transpose, a reshape by two ``aten::size`` values (4 nodes: two sizes, a list, the
reshape), an add. ``default`` / ``legacy``: the node count of the backend's frozen, optimised step by kind, and its time per one-frame call (ms per call, fastest of
7 batches of 200, three times) with the profiling executor (PyTorch's default) or the legacy one. ``onednn``: the
same with TorchScript's oneDNN Graph fuser on (``torch.jit.enable_onednn_fusion``, which would merge products with
their adds and activations; the step frozen, not optimised, as the fuser wants it): it fails at the step's first
run. Output: executor_and_op_costs.txt.
"""

import collections
import copy
import sys
import time

import torch

mode = sys.argv[1]
if mode == "legacy":
    torch._C._jit_set_profiling_executor(False)
elif mode == "onednn":
    torch.jit.enable_onednn_fusion(True)
torch.set_num_threads(1)


def fastest(fn, calls: int = 200, batches: int = 7) -> float:
    with torch.inference_mode():
        for _ in range(50):
            fn()
        best = 1e9
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - t) / calls)
    return best


if mode == "ops":

    class Chain(torch.nn.Module):
        def __init__(self, n: int, kind: str) -> None:
            super().__init__()
            self.n, self.kind = n, kind

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.n):
                if self.kind == "reshape by sizes":
                    x = x.reshape(x.shape[0], x.shape[1], -1)
                elif self.kind == "transpose":
                    x = x.transpose(1, 2)
                else:
                    x = x + 1.0
            return x

    x = torch.zeros(1, 4, 8)
    for kind in ("transpose", "reshape by sizes", "add"):
        times = []
        for n in (0, 200):
            with torch.no_grad():
                m = torch.jit.optimize_for_inference(
                    torch.jit.freeze(torch.jit.trace(Chain(n, kind).eval(), (x,)))
                )
            times.append(fastest(lambda m=m: m(x), calls=500))
        print(f"{kind}: {(times[1] - times[0]) / 200 * 1e6:.3f} us per repetition")
else:
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
        m = torch.jit.freeze(torch.jit.trace(step, tuple(ex2), check_trace=False).eval())
        if mode != "onednn":
            m = torch.jit.optimize_for_inference(m)
    kinds = collections.Counter(node.kind() for node in m.graph.nodes())
    print(f"{sum(kinds.values())} graph nodes:", ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    print(
        f"{mode} executor, traced step:",
        " ".join(f"{fastest(lambda: m(*feed)) * 1e3:.3f}" for _ in range(3)),
        "ms",
    )
