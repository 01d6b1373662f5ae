"""Session 30 probe: one-frame products of the default model's sizes in float32 and through PyTorch's dynamic int8
product (per-channel int8 weights, the op ``torchscript-int8`` uses), float16 and bfloat16. Microseconds per call,
fastest of 7 batches, one thread. Run from the repository root:

    python bench/results/torchscript-probes/int8_products.py [warm|cold]    # output: int8_products.txt

``warm`` (the default; session 30): one weight matrix called again and again (batches of 500 calls), so it stays
in the cache and the bytes matter less than in a stream, where the other weights evict it. K x N: the input width
and the output width (771 x 1024 and 3072 x 512: the pre-encoder's first two convs; 256 x 768 and 256 x 256: the
standard layers' Q/K/V and their smaller products).

``cold`` (session 31): 40 different matrices of one size called in turn (batches of 5 rounds), so each is evicted
before it comes round again when the 40 outgrow the cache, against one matrix called again and again, in float32
and int8 (256 x 1024 for scale; 128 x 385: one TIM mechanism's fused competition + Q/K/V).
"""

import functools
import sys
import time
import warnings

import torch

torch.set_num_threads(1)
warnings.simplefilter("ignore")  # PyTorch 2.13 marks its quantized tensors deprecated
mode = sys.argv[1] if len(sys.argv) > 1 else "warm"


def fastest(fn, calls: int = 500) -> float:
    for _ in range(50):
        fn()
    best = 1e9
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e6


def int8_packed(w: torch.Tensor) -> object:
    """``w`` [N, K] in int8, one scale per output row, packed for ``torch.ops.quantized.linear_dynamic``."""
    scale = w.abs().amax(1) / 127
    q = torch.quantize_per_channel(w, scale, torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None)


def in_turn(fn, args: list[tuple]) -> None:
    for a in args:
        fn(*a)


print(f"torch {torch.__version__}, quantized engine {torch.backends.quantized.engine}, mode {mode}")
if mode == "warm":
    print("| K x N | float32 mm | int8 (dynamic, 7-bit inputs) | float16 mm | bfloat16 mm |")
    print("|---|---|---|---|---|")
    for k, n in [(3072, 512), (771, 1024), (256, 768), (256, 256)]:
        w = torch.randn(n, k) * 0.05
        x = torch.randn(1, k)
        packed = int8_packed(w)
        wt = w.t().contiguous()
        with torch.inference_mode():
            f32 = fastest(functools.partial(torch.mm, x, wt))
            q8 = fastest(functools.partial(torch.ops.quantized.linear_dynamic, x, packed, True))
            f16 = fastest(functools.partial(torch.mm, x.half(), wt.half()))
            bf = fastest(functools.partial(torch.mm, x.bfloat16(), wt.bfloat16()))
        print(f"| {k} x {n} | {f32:.1f} | {q8:.1f} | {f16:.1f} | {bf:.1f} |")
elif mode == "cold":
    print("| K x N | matrices in turn (float32 MiB) | float32 mm | int8 (dynamic, 7-bit inputs) |")
    print("|---|---|---|---|")
    for k, n in [(256, 768), (256, 256), (256, 1024), (128, 385)]:
        x = torch.randn(1, k)
        for copies in (1, 40):
            ws = [torch.randn(n, k) * 0.05 for _ in range(copies)]
            f32_args = [(x, w.t().contiguous()) for w in ws]
            q8_args = [(x, int8_packed(w), True) for w in ws]
            with torch.inference_mode():
                f32 = fastest(functools.partial(in_turn, torch.mm, f32_args), calls=5) / copies
                q8 = (
                    fastest(functools.partial(in_turn, torch.ops.quantized.linear_dynamic, q8_args), 5)
                    / copies
                )
            print(
                f"| {k} x {n} | {copies} ({copies * k * n * 4 / 2**20:.1f}) | {f32:.2f} | {q8:.2f} |",
                flush=True,
            )
else:
    sys.exit(f"unknown mode {mode!r}: warm or cold")
