"""Session 27 one-off probe (see bench/README.md, "Reduced precision inside PyTorch"); run from the repository
root with PYTHONPATH=. and one thread. Kept as it ran; not part of the benchmarks. Only its times are quoted: its random state
feed gives an all-zero output here, so the "max abs diff" lines compare zeros and say nothing about accuracy."""
# ruff: noqa: E402

import copy
import time

import torch

torch.set_num_threads(1)
from models.pretrained import load_pretrained
from models.static_step import StaticStep

model = load_pretrained("default").model.float().eval()


def build(dtype):
    step = StaticStep(copy.deepcopy(model).to(dtype)).eval()
    ex = [torch.zeros(1, 1, 257, dtype=dtype)] + [
        torch.zeros(s, dtype=dtype) for _, s in step.state_shapes(1, frames=1)
    ]
    with torch.no_grad():
        tr = torch.jit.trace(step, tuple(ex), check_trace=False)
        mod = torch.jit.optimize_for_inference(torch.jit.freeze(tr.eval()))
    return step, mod, ex


res = {}
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    try:
        step, mod, ex = build(dtype)
        g = torch.Generator().manual_seed(0)
        feed = [torch.randn(1, 1, 257, generator=g).abs().to(dtype)] + [
            (torch.randn(e.shape, generator=g) * 0.1).to(dtype)
            if i != 0
            else torch.zeros(e.shape, dtype=dtype)
            for i, e in enumerate(ex[1:])
        ]
        # mask: index of "mask" in state list
        names = [n for n, _ in step.state_shapes(1)]
        feed[1 + names.index("mask")] = torch.zeros(feed[1 + names.index("mask")].shape, dtype=dtype)
        with torch.inference_mode():
            for _ in range(20):
                out = mod(*feed)
            best = 1e9
            for _ in range(7):
                t = time.perf_counter()
                for _ in range(200):
                    out = mod(*feed)
                best = min(best, (time.perf_counter() - t) / 200)
        res[dtype] = out[0].float()
        print(dtype, f"{best * 1e3:.3f} ms per one-frame call, rtf {best / 0.016:.3f}")
    except Exception as e:
        print(dtype, "failed:", str(e)[:300])
ref = res[torch.float32]
for d, o in res.items():
    print(
        d,
        "max abs diff vs f32 log-mag",
        (o - ref).abs().max().item(),
        "snr dB",
        (10 * torch.log10(ref.pow(2).sum() / (o - ref).pow(2).sum().clamp_min(1e-30))).item(),
    )
