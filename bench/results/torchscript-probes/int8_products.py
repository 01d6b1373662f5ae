"""Session 30 probe: one-frame products of the default model's sizes in float32 and through PyTorch's dynamic int8
product (per-channel int8 weights, the op ``torchscript-int8`` uses), float16 and bfloat16. Microseconds per call,
fastest of 7 batches of 500, one thread, the weights warm in the cache (so the bytes matter less than in a stream,
where the other weights evict them). Run from the repository root:

    python bench/results/torchscript-probes/int8_products.py    # output: int8_products.txt

K x N: the input width and the output width (771 x 1024 and 3072 x 512: the pre-encoder's first two convs;
256 x 768 and 256 x 256: the standard layers' Q/K/V and their smaller products).
"""

import functools
import time
import warnings

import torch

torch.set_num_threads(1)
warnings.simplefilter("ignore")  # PyTorch 2.13 marks its quantized tensors deprecated


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


print(f"torch {torch.__version__}, quantized engine {torch.backends.quantized.engine}")
print("| K x N | float32 mm | int8 (dynamic, 7-bit inputs) | float16 mm | bfloat16 mm |")
print("|---|---|---|---|---|")
for k, n in [(3072, 512), (771, 1024), (256, 768), (256, 256)]:
    w = torch.randn(n, k) * 0.05
    x = torch.randn(1, k)
    scale = w.abs().amax(1) / 127
    packed = torch.ops.quantized.linear_prepack(
        torch.quantize_per_channel(w, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8), None
    )
    wt = w.t().contiguous()
    with torch.inference_mode():
        f32 = fastest(functools.partial(torch.mm, x, wt))
        q8 = fastest(functools.partial(torch.ops.quantized.linear_dynamic, x, packed, True))
        f16 = fastest(functools.partial(torch.mm, x.half(), wt.half()))
        bf = fastest(functools.partial(torch.mm, x.bfloat16(), wt.bfloat16()))
    print(f"| {k} x {n} | {f32:.1f} | {q8:.1f} | {f16:.1f} | {bf:.1f} |")
