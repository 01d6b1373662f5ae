"""Where a streaming hop's time goes, against the floor set by reading the weights (issue 5).

    python bench/bench_step_floor.py [--model default | --checkpoint PATH] [--compile]

One frame of the model touches every weight once: a per-hop stream reads all of them (6M floats, 24 MB for the
default model) every 16 ms. The first rows time exactly that and nothing else: one matrix-vector product per weight
matrix of the model, in float32 and in bfloat16 and float16 copies (the model itself is float32), one CPU thread;
then the same bytes as a single product: the weight-read floor alone (no per-hop float32 implementation on this
machine can go below it; the gap to the row above is the cost of making 133 calls). On this VM the 22 MiB fit in
the L3 cache, so that floor is the L3-resident read rate, not main memory's. The next rows time the traced step
itself (the TorchScript backend's module, ``enhance.fixed_step``); the same traced graph with every width cut to
the least its heads allow (all but the 257 input bins and the inter-mechanism attention's 2 x 32, see
``shrunk``), whose time is the graph's per-operation overhead (the interpreter, allocations, small kernels); the
whole streaming engine per hop (STFT, host, step, overlap-add), and the same per frame when two frames share a call
(32 ms chunks: each weight is read once for both). ``--compile`` adds the step compiled by torch.compile (inductor,
C++ wrapper, frozen weights; needs a C++ compiler, about a minute to compile).

Times are the fastest of 5 batches (the machine is shared; the minimum is the most repeatable statistic). The
real-time factor column is the time per frame divided by the 16 ms hop. Prints a Markdown table and writes
``bench/results/step-floor.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, load_model

ROOT = Path(__file__).resolve().parents[1]


def fastest(fn: Callable[[], object], calls: int, batches: int = 5) -> float:
    """Seconds per call: the fastest of ``batches`` batches of ``calls`` calls, after a warm-up."""
    for _ in range(max(10, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def shrunk(cfg: Any) -> Any:
    """``cfg`` (an :class:`models.enhancer.EnhancerConfig`) with its widths cut to the least its heads and
    mechanisms allow (head size 2, pre-encoder 32 channels, FFNs 32 per mechanism; the 257 input bins and the
    inter-mechanism attention's widths are kept) and everything else kept: the same operations, blocks, heads and
    context, so its step's time is the per-operation overhead."""
    d = 2 * cfg.standard.attention.n_heads
    attention = dataclasses.replace(cfg.standard.attention, d_model=d)
    pre = dataclasses.replace(cfg.pre_encoder, channels=(32,) * (len(cfg.pre_encoder.channels) - 1) + (d,))
    standard = dataclasses.replace(cfg.standard, attention=attention, d_ff=32)
    tim = cfg.tim
    if tim is not None:
        tim = dataclasses.replace(
            tim,
            attention=dataclasses.replace(tim.attention, d_model=d),
            d_ff=32 * tim.n_mechanisms,
        )
    return dataclasses.replace(cfg, pre_encoder=pre, standard=standard, tim=tim)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    ap.add_argument("--compile", action="store_true", help="also time the step compiled with torch.compile")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step-floor.md"))
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT))
    import torch

    from enhance.backends import streaming_backend
    from enhance.streaming import StreamingEnhancer
    from models.enhancer import Enhancer
    from models.group_linear import GroupLinear

    torch.set_num_threads(1)
    ck = load_model(args)
    model = ck.model.float().eval()
    hop_ms = 1000.0 * model.cfg.stft.hop_length / model.cfg.stft.sample_rate
    rows: list[tuple[str, float, int]] = []  # (what, seconds per call, frames per call)

    with torch.inference_mode():
        # every weight matrix as [out, in] (convs: out x in*k; group-linear weights: per group)
        mats = []
        for module in model.modules():
            if isinstance(module, GroupLinear):  # [G, d_in, d_out]: one [d_out, d_in] matrix per group
                mats += [w.t().contiguous() for w in module.weight.detach()]
            elif isinstance(module, torch.nn.Conv1d | torch.nn.Linear):
                mats.append(module.weight.detach().reshape(module.weight.shape[0], -1).contiguous())
        n_weights = sum(m.numel() for m in mats)
        for dtype, label in (
            (torch.float32, "float32"),
            (torch.bfloat16, "bfloat16"),
            (torch.float16, "float16"),
        ):
            ws = [m.to(dtype) for m in mats]
            for frames in (1, 2) if dtype == torch.float32 else (1,):
                xs = [torch.randn(frames, w.shape[1], dtype=dtype) for w in ws]

                def products(xs: list[torch.Tensor] = xs, ws: list[torch.Tensor] = ws) -> None:
                    for x, w in zip(xs, ws, strict=True):
                        torch.nn.functional.linear(x, w)

                rows.append(
                    (f"weights only, {label} ({len(ws)} products)", fastest(products, args.calls), frames)
                )

        # the same bytes as one matrix-vector product: the memory-bandwidth floor alone, without the per-call
        # overhead of 133 separate products (the gap between the two rows)
        width = 1024
        rows_needed = -(-n_weights // width)
        big = torch.randn(rows_needed, width)
        for frames in (1, 2):
            x = torch.randn(frames, width)
            rows.append(
                (
                    f"weights only, float32, one product of all {n_weights / 1e6:.2f}M",
                    fastest(lambda x=x, w=big: torch.nn.functional.linear(x, w), args.calls),
                    frames,
                )
            )
        del big

        backend = streaming_backend(model, "torchscript")

        def feed_for(frames: int) -> dict[str, torch.Tensor]:
            """The traced step's inputs for ``frames`` new frames after a full ring (a new stream's state)."""
            state = backend.new_state(1).channels[0]
            mask = backend._mask(model.cfg.context_frames, frames)
            return {"feat": torch.randn(1, frames, model.cfg.pre_encoder.n_bins), "mask": mask, **state}

        for frames in (1, 2):
            feed = feed_for(frames)
            rows.append(
                (
                    "traced step (TorchScript module)",
                    fastest(lambda feed=feed: backend.run(feed), args.calls),
                    frames,
                )
            )
        # the same graph with almost no weights: what the traced step costs beyond reading weights and caches
        small = Enhancer(shrunk(model.cfg)).eval()
        small_backend = streaming_backend(small, "torchscript")
        small_feed = {
            "feat": torch.randn(1, 1, model.cfg.pre_encoder.n_bins),
            "mask": small_backend._mask(model.cfg.context_frames, 1),
            **small_backend.new_state(1).channels[0],
        }
        n_small = sum(p.numel() for p in small.parameters())
        rows.append(
            (
                f"traced step, same graph with {n_small / 1e6:.2f}M weights (per-operation overhead)",
                fastest(lambda: small_backend.run(small_feed), args.calls),
                1,
            )
        )
        if args.compile:
            import torch._inductor.config as inductor

            inductor.cpp_wrapper = True
            inductor.freezing = True
            compiled = torch.compile(backend.static, dynamic=False, fullgraph=True)
            feed = feed_for(1)
            inputs = [feed[name] for name in backend.names]
            start = time.perf_counter()
            compiled(*inputs)
            print(f"torch.compile took {time.perf_counter() - start:.0f} s", file=sys.stderr)
            rows.append(
                (
                    "step compiled by torch.compile (inductor)",
                    fastest(lambda: compiled(*inputs), args.calls),
                    1,
                )
            )

        rng = np.random.default_rng(0)
        hop = model.cfg.stft.hop_length
        for frames in (1, 2):
            engine = StreamingEnhancer(model, backend=backend)
            chunks = iter(
                (0.05 * rng.standard_normal((1, hop * frames))).astype(np.float32)
                for _ in range(args.calls * 6 + 200)
            )
            rows.append(
                (
                    "streaming engine, whole hop (TorchScript)",
                    fastest(lambda engine=engine, chunks=chunks: engine.process(next(chunks)), args.calls),
                    frames,
                )
            )

    # the float32 floor per frame for each number of frames per call (its own row for 1 and 2 frames)
    floor = {
        frames: seconds / frames
        for what, seconds, frames in rows
        if what.startswith("weights only, float32 (")
    }
    lines = [
        f"Step floor, one CPU thread, {cpu_summary()}, "
        f"{datetime.date.today().isoformat()}. Command: `{command_line()}`",
        "",
        f"The model has {n_weights / 1e6:.2f}M weights in matrices ({4 * n_weights / 2**20:.1f} MiB as float32). "
        f"Fastest of 5 batches per row; real-time factor = time per frame / {hop_ms:g} ms hop.",
        "",
        "| what | frames per call | ms per call | ms per frame | real-time factor "
        f"| x the {len(mats)}-product float32 row (same frames per call) |",
        "|---|---|---|---|---|---|",
    ]
    for what, seconds, frames in rows:
        per_frame = 1000.0 * seconds / frames
        lines.append(
            f"| {what} | {frames} | {1000 * seconds:.3f} | {per_frame:.3f} | {per_frame / hop_ms:.3f} "
            f"| {seconds / frames / floor.get(frames, floor[1]):.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    from recipes.run_folder import write_text

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, text)  # atomically: a run stopped while writing leaves the committed table whole
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
