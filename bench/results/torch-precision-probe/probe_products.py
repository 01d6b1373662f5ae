"""Session 27 one-off probe (see bench/README.md, "Reduced precision inside PyTorch"); run from the repository
root with PYTHONPATH=. and one thread. Kept as it ran; not part of the benchmarks."""
# ruff: noqa: B023, B905

import time

import torch

from models.group_linear import GroupLinear
from models.pretrained import load_pretrained

torch.set_num_threads(1)
model = load_pretrained("default").model.float().eval()
mats = []
for module in model.modules():
    if isinstance(module, GroupLinear):
        mats += [w.t().contiguous() for w in module.weight.detach()]
    elif isinstance(module, torch.nn.Conv1d | torch.nn.Linear):
        mats.append(module.weight.detach().reshape(module.weight.shape[0], -1).contiguous())
print(len(mats), sum(m.numel() for m in mats) / 1e6)


def fastest(fn, calls=200, reps=7):
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


for engine in ("fbgemm", "x86", "onednn", "qnnpack"):
    try:
        torch.backends.quantized.engine = engine
        with torch.inference_mode():
            xs = [torch.randn(1, w.shape[1]) for w in mats]
            packed = []
            for w in mats:
                scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0
                qw = torch.quantize_per_channel(
                    w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8
                )
                packed.append(torch.ops.quantized.linear_prepack(qw, None))

            def f32():
                for x, w in zip(xs, mats):
                    torch.nn.functional.linear(x, w)

            def q8():
                for x, p in zip(xs, packed):
                    torch.ops.quantized.linear_dynamic(x, p, True)

            def q8b():
                for x, p in zip(xs, packed):
                    torch.ops.quantized.linear_dynamic(x, p, False)

            a = fastest(f32)
            b = fastest(q8)
            c = fastest(q8b)
            err = max(
                (
                    (torch.ops.quantized.linear_dynamic(x, p, True) - torch.nn.functional.linear(x, w)).norm()
                    / torch.nn.functional.linear(x, w).norm()
                ).item()
                for x, w, p in zip(xs, mats, packed)
            )
            print(
                engine,
                f"f32 {a * 1e3:.3f} ms  int8 dyn(reduce_range) {b * 1e3:.3f} ms  int8 dyn {c * 1e3:.3f} ms ratio {b / a:.2f} {c / a:.2f} worst rel err {err:.4f}",
            )
    except Exception as e:
        print(engine, "failed", str(e)[:200])
with torch.inference_mode():
    xs = [torch.randn(1, w.shape[1]) for w in mats]
    w16 = [w.half() for w in mats]

    def f32():
        for x, w in zip(xs, mats):
            torch.nn.functional.linear(x, w)

    def h16():
        for x, w in zip(xs, w16):
            torch.nn.functional.linear(x.half(), w).float()

    x16 = [x.half() for x in xs]

    def h16only():
        for x, w in zip(x16, w16):
            torch.nn.functional.linear(x, w)

    a = fastest(f32)
    b = fastest(h16)
    c = fastest(h16only)
    print(
        f"f32 {a * 1e3:.3f}  fp16 with casts {b * 1e3:.3f} ({b / a:.2f}x)  fp16 no casts {c * 1e3:.3f} ({c / a:.2f}x)"
    )
