"""Session 29: what writing one new frame's keys or values into a 250-slot ring costs, torch against numpy
(microseconds per copy, the default model's shapes; fastest of 2 runs of 20,000).

    python bench/results/onnx-iobinding/copy_cost.py
"""

import time

import torch

torch.set_num_threads(1)
k, v = torch.zeros(1, 16, 16, 250), torch.zeros(1, 16, 250, 16)
nk, nv = torch.randn(1, 16, 16, 1), torch.randn(1, 16, 1, 16)
K, V, NK, NV = k.numpy(), v.numpy(), nk.numpy()[..., 0], nv.numpy()[:, :, 0]


def cost(f, n: int = 20000) -> float:
    best = float("inf")
    for _ in range(2):
        for _ in range(1000):
            f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def numpy_k() -> None:
    K[..., 17] = NK


def numpy_v() -> None:
    V[:, :, 17] = NV


print("| ring | torch narrow().copy_() | numpy slice assignment |\n|---|---|---|")
print(f"| keys [1, 16, 16, 250] | {cost(lambda: k.narrow(3, 17, 1).copy_(nk)):.2f} | {cost(numpy_k):.2f} |")
print(f"| values [1, 16, 250, 16] | {cost(lambda: v.narrow(2, 17, 1).copy_(nv)):.2f} | {cost(numpy_v):.2f} |")
