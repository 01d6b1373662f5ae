"""Choosing the streaming engine's backend: what runs the model's incremental step.

    backend = streaming_backend(model, "auto")
    engine = StreamingEnhancer(model, backend=backend)

* ``pytorch``: :meth:`models.enhancer.Enhancer.step`, eager PyTorch. Any device, dtype and configuration.
* ``torchscript``: :class:`enhance.fixed_step.TracedStepper`, the fixed-shape step traced and frozen, up to 64
  frames per call. On a CPU it is faster than eager PyTorch at every chunk size, 1.8-2.4x for 16 ms chunks
  (``bench/bench_chunk_sizes.py``). CPU, float32.
* ``torchscript-int8``: the same traced step with the pre-encoder's four products (its largest weights, 10.1 of
  22.5 MiB on the default model) in 8 bits, one scale per output channel (:mod:`enhance.torch_int8`, PyTorch's
  dynamic int8 product): faster per 16 ms hop, but not the same samples (about 43 dB signal to difference on the
  default model; ``bench/bench_int8.py``). Chosen only by name. Needs PyTorch's int8 kernels for the CPU
  (x86-64: fbgemm; ARM: qnnpack, not tried).
* ``onnxruntime``: :class:`enhance.onnx_backend.OnnxStepper` on the step exported to temporary files (up to 64
  frames per call, and a one-frame export for per-hop calls); needs the ``onnx`` extra.
* ``onnxruntime-int8``: the same with the step's weights in 8 bits, one scale per block of 32
  (:func:`enhance.onnx_backend.quantize_step`): faster per 16 ms hop, but not the same samples (about 42 dB signal
  to difference on the default model; on the 120 dev pairs only STOI is measurably lower, by 0.0001; ``bench/bench_int8.py``).
  Chosen only by name. Creating it exports and quantises two steps: seconds of
  start-up per CLI run or server model.
* ``native``: :class:`enhance.native_backend.NativeStepper`, the step in plain C (compiled on first use; needs a C
  compiler): no per-operation overhead, each weight matrix read once for up to 16 frames per call, the fastest
  backend for chunks up to about 100 ms (``bench/bench_chunk_sizes.py``; from 300 ms ``torchscript`` is faster).
  Standard and TIM blocks (no SDU or MAE), CPU, float32.
* ``native-fp16``: the same with the weight matrices and the key/value rings in float16 (half the bytes per
  frame; float32 arithmetic): not the same samples, but close (about 81 dB signal to difference on the default
  model, median over the dev pairs; scores unchanged; ``bench/bench_int8.py``). Chosen only by name.
* ``native-int8``: the same with the weight matrices in int8, one float scale per output column (a quarter of
  the bytes), the rings in float16: about 47 dB from the float32 samples (median over the dev pairs), scores
  unchanged
  (``bench/bench_int8.py``). Chosen only by name.
* ``auto``: ``native`` when the model can run it and the C step can be built here (a C compiler, or a build
  already cached); else ``torchscript`` when the model can run that (float32, on the CPU, a bounded attention
  context and the one-frame lookahead the fixed step is written for); else ``pytorch``. All three give the same
  samples to float32 rounding.

All but ``native-fp16``, ``native-int8``, ``torchscript-int8`` and ``onnxruntime-int8`` give the same samples (float32 rounding;
tested). A backend holds no per-stream state (that lives in the engine's :class:`enhance.streaming.StreamState`),
so one backend can serve many streams, also from several threads at once (tested for ``torchscript``,
``torchscript-int8`` and ``native``).
"""

from __future__ import annotations

import torch

from enhance.step_backend import StepBackend
from models.enhancer import Enhancer, expect_enhancer
from models.static_step import unsupported

# the C step (enhance/native_backend.py) and its weights' precision
NATIVE = {"native": "float32", "native-fp16": "float16", "native-int8": "int8"}
# the reduced-precision backends' distance from the float output on the bundled default (median signal to
# difference over the 120 dev pairs, bench/bench_int8.py), for both commands' --help
REDUCED_PRECISION = (
    "native-fp16 / native-int8 / onnxruntime-int8 / torchscript-int8: reduced weights, faster, "
    "about 81 / 47 / 42 / 43 dB from the float output"
)
# the traced (TorchScript) step, and with the pre-encoder's products in int8
TORCHSCRIPT = {"torchscript": False, "torchscript-int8": True}

BACKENDS = ("auto", "pytorch", *TORCHSCRIPT, *NATIVE, "onnxruntime", "onnxruntime-int8")


def resolve_backend(model: Enhancer, name: str = "auto") -> str:
    """The concrete backend ``name`` stands for with this model (``auto`` resolved); raises ValueError when the
    model cannot run on the one asked for."""
    expect_enhancer(model)
    if name not in BACKENDS:
        raise ValueError(f"unknown streaming backend '{name}' (choose from {', '.join(BACKENDS)})")
    param = next(model.parameters())
    reason = "it runs on the CPU" if param.device.type != "cpu" else unsupported(model)
    if name == "auto":
        if reason is not None or param.dtype != torch.float32:
            return "pytorch"
        return "native" if _native_ready(model) else "torchscript"
    if name in NATIVE and reason is None:
        from enhance.native_backend import native_unsupported

        reason = native_unsupported(model)
    if name != "pytorch" and reason is not None:
        raise ValueError(
            f"the {name} backend cannot run this model: {reason} (use the pytorch backend: "
            "--stream-backend pytorch, or streaming_backend(model, 'pytorch'))"
        )
    return name


def _native_ready(model: Enhancer) -> bool:
    """Whether the C step covers ``model`` and can be built (or is already built, or prebuilt) here: ``auto`` takes
    it then. The first call on a machine compiles it (about 3 s; cached), as naming ``native`` would."""
    from enhance.native_backend import NativeUnavailable, library, native_unsupported

    if native_unsupported(model) is not None:
        return False
    try:
        library()
    except NativeUnavailable:
        return False
    return True


def streaming_backend(model: Enhancer, name: str = "auto", threads: int = 1) -> StepBackend | None:
    """The backend object for :class:`enhance.streaming.StreamingEnhancer` (None: PyTorch). ``threads``:
    onnxruntime's intra-op threads (TorchScript follows ``torch.set_num_threads``)."""
    kind = resolve_backend(model, name)
    if kind in TORCHSCRIPT:  # int8: raises Int8Unavailable (a RuntimeError) without PyTorch's int8 kernels
        from enhance.fixed_step import TracedStepper

        return TracedStepper(model, int8=TORCHSCRIPT[kind])
    if kind in NATIVE:  # raises NativeUnavailable (a RuntimeError saying why) without a compiler
        from enhance.native_backend import NativeStepper

        return NativeStepper(model, weights=NATIVE[kind])
    if kind in ("onnxruntime", "onnxruntime-int8"):
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as exc:
            raise ImportError(f"the {kind} backend needs: pip install 'tim-enhance[onnx]' ({exc})") from None
        from enhance.onnx_backend import onnx_stepper

        return onnx_stepper(model, int8=kind == "onnxruntime-int8", threads=threads)
    return None
