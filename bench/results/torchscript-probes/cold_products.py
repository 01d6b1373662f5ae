"""Session 31 probe: one-frame products in float32 and through PyTorch's dynamic int8 product, warm in the cache
(one weight matrix called again and again, as ``int8_products.py`` measures) and cold (40 different matrices
called in turn, so each is evicted before it comes round again, as in a stream, where every weight of the model
is read once per 16-ms hop). Microseconds per call, fastest of 30 rounds, one thread. Run from the repository
root:

    python bench/results/torchscript-probes/cold_products.py    # output: cold_products.txt

K x N: input and output width (256 x 768: a standard layer's fused Q/K/V; 256 x 256: its output and FFN maps;
256 x 1024 for scale; 128 x 385: one mechanism's fused competition + Q/K/V in a TIM block).
"""

import time
import warnings

import torch

torch.set_num_threads(1)
warnings.simplefilter("ignore")  # PyTorch 2.13 marks its quantized tensors deprecated


def per_call_us(k: int, n: int, copies: int, rounds: int = 30) -> dict[str, float]:
    weights = [torch.randn(n, k) * 0.05 for _ in range(copies)]
    x = torch.randn(1, k)
    packed = []
    for w in weights:
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        q = torch.quantize_per_channel(w, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        packed.append(torch.ops.quantized.linear_prepack(q, None))
    transposed = [w.t().contiguous() for w in weights]

    def float_mm() -> None:
        for w in transposed:
            torch.mm(x, w)

    def int8() -> None:
        for p in packed:
            torch.ops.quantized.linear_dynamic(x, p, True)

    result = {}
    for name, run in (("float32 mm", float_mm), ("int8", int8)):
        run()
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
        result[name] = 1e6 * best / copies
    return result


if __name__ == "__main__":
    print("| K x N | matrices in turn (float32 MiB) | float32 mm (µs) | int8 (µs) |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        for k, n in ((256, 768), (256, 256), (256, 1024), (128, 385)):
            for copies in (1, 40):
                r = per_call_us(k, n, copies)
                mib = copies * k * n * 4 / 2**20
                print(
                    f"| {k} x {n} | {copies} ({mib:.1f}) | {r['float32 mm']:.2f} | {r['int8']:.2f} |",
                    flush=True,
                )
