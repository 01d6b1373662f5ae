"""The incremental step exported to ONNX and run with onnxruntime: an alternative backend of the streaming engine.

    path = export_step(model, "step.onnx")           # once per model
    engine = StreamingEnhancer(model, backend=OnnxStepper(path, model))

:class:`OnnxStepper` has the contract of :meth:`models.enhancer.Enhancer.step` (frames in, the output frames they
complete out), so the engine's framing, overlap-add and latency are unchanged; results equal the PyTorch backend
to float32 rounding (tested). Needs ``onnx`` (export) and ``onnxruntime`` (run): ``pip install 'tim-enhance[onnx]'``.

:func:`quantize_step` makes an 8-bit copy of an exported step (the ``onnxruntime-int8`` backend): its weights are
about a quarter of the bytes, in blocks of 32 with their own scales. It is not the same numbers: the output differs
from float32 by about 42 dB on the default model (signal to difference; ``bench/bench_int8.py`` scores both).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from enhance.atomic_files import atomic_path
from enhance.fixed_step import FixedState, FixedStepper
from models.enhancer import Enhancer, weights_digest
from models.static_step import StaticStep, slot_axis


def export_step(
    model: Enhancer,
    path: str | os.PathLike[str],
    opset: int = 17,
    frames: int | None = None,
    int8: bool = False,
) -> Path:
    """Write the step of ``model`` (float32, one channel) to ``path``, atomically. ``frames``: None (the default)
    leaves the number of new frames per call free; a number fixes it, so the exporter can fold the graph's shape
    arithmetic away: the one-frame step of a per-hop stream (:class:`OnnxStepper`'s ``one_frame``) is then faster
    per call in int8 (0.91x, ``bench/bench_int8.py``; no measurable gain in float32). ``int8``: the weights in int8
    (:func:`quantize_step` on the float export).

    The step is exported from a float32 copy in eval mode (a new module is in training mode: without the explicit
    eval() below, dropout would be switched on); the caller's model is left as it was.
    """
    if frames is not None and frames < 1:
        raise ValueError(f"frames must be at least 1 (or None: free), got {frames}")
    if int8:
        with tempfile.TemporaryDirectory() as tmp:
            return quantize_step(export_step(model, Path(tmp) / "step.onnx", opset, frames), path)
    step = StaticStep(copy.deepcopy(model).float()).eval()  # float32, without converting the caller's model
    example = frames or 2  # a free number of frames is exported from 2 new frames
    shapes = step.state_shapes(batch=1, frames=example)
    n_bins = model.cfg.pre_encoder.n_bins
    inputs = [torch.zeros(1, example, n_bins)] + [torch.zeros(s) for _, s in shapes]
    n_maps = len(model.competition_blocks)
    input_names = ["feat"] + [name for name, _ in shapes]
    output_names = (
        ["log_mag"]
        + [f"competition_{i}" for i in range(n_maps)]
        + [f"new_{name}" for name, _ in shapes if name != "mask"]
    )
    # the axes that count new frames (the state's other sizes are fixed)
    dynamic = {"feat": {1: "frames"}, "mask": {0: "frames", 1: "slots_and_frames"}, "log_mag": {1: "frames"}}
    dynamic.update({f"competition_{i}": {1: "frames"} for i in range(n_maps)})
    for name, _ in shapes:
        if name.startswith(("k_", "v_", "u_")):
            dynamic[f"new_{name}"] = {slot_axis(name): "frames"}
    with atomic_path(path) as tmp, torch.no_grad():
        torch.onnx.export(
            step,
            tuple(inputs),
            tmp,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic if frames is None else None,
            opset_version=opset,
            dynamo=False,
        )
        _write_origin(tmp, origin(model))
    return Path(path)


# what a step file records of the model it was exported from, checked by OnnxStepper against the model it is
# given: a file run beside a model with another attenuation limit or other weights gave other samples, silently
LIMIT_KEY, WEIGHTS_KEY = ORIGIN_KEYS = ("tim_enhance.max_attenuation_db", "tim_enhance.weights_sha256")
# an 8-bit step says so: onnxruntime older than 1.23 is refused with a message saying what to install
WEIGHTS_FORMAT_KEY, BLOCKWISE = "tim_enhance.weights_format", "8-bit per block (MatMulNBits)"


def origin(model: Enhancer) -> dict[str, str]:
    limit = model.cfg.max_attenuation_db
    return {LIMIT_KEY: "none" if limit is None else repr(float(limit)), WEIGHTS_KEY: weights_digest(model)}


def _write_origin(path: str | os.PathLike[str], props: dict[str, str]) -> None:
    import onnx

    proto = onnx.load(str(path))
    kept = [p for p in proto.metadata_props if p.key not in props]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in props.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.save(proto, str(path))


def _check_origin(path: str | os.PathLike[str], session: Any, model: Enhancer) -> None:
    """Refuse a step file made from another attenuation limit or other weights than ``model``'s."""
    found = session.get_modelmeta().custom_metadata_map
    again = "export it again from this model (python -m enhance.onnx_backend, or export_step)"
    if not all(key in found for key in ORIGIN_KEYS):
        raise ValueError(f"{path} does not say which weights and attenuation limit it holds: {again}")
    want = origin(model)
    if found[LIMIT_KEY] != want[LIMIT_KEY]:
        raise ValueError(
            f"{path} was exported with the attenuation limit {found[LIMIT_KEY]} dB and the model's is "
            f"{want[LIMIT_KEY]}: {again} (after set_max_attenuation)"
        )
    if found[WEIGHTS_KEY] != want[WEIGHTS_KEY]:
        raise ValueError(f"{path} was exported from other weights than this model's: {again}")


_ROOT_LOGGER_LOCK = threading.Lock()


@contextlib.contextmanager
def _keep_root_logger_bare() -> Iterator[None]:
    """onnxruntime's quantiser logs through the module-level ``logging.info``/``warning``, which install a stderr
    handler on the root logger when it has none (``logging.basicConfig``), changing how the rest of the process
    logs. For the call, a root logger without handlers gets a NullHandler, removed afterwards; its level and any
    handlers it has are left alone."""
    root = logging.getLogger()
    with _ROOT_LOGGER_LOCK:
        handler = None if root.handlers else logging.NullHandler()
        if handler is not None:
            root.addHandler(handler)
        try:
            yield
        finally:
            if handler is not None:
                root.removeHandler(handler)


def quantize_step(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Write ``src`` (a step from :func:`export_step`) to ``dst`` with the constant weights of all its matrix
    products in 8 bits, atomically: each product becomes onnxruntime's ``MatMulNBits`` with one scale per block
    of 32 weights (symmetric), and onnxruntime quantises each product's input to int8 per block as it runs
    (:mod:`enhance.onnx_graph`, which also removes the layout operations a fixed-shape step does not need). Needs
    onnxruntime 1.23 or later (its 8-bit kernels for x86-64 and ARM64).

    Until session 29 this was onnxruntime's dynamic quantisation (one int8 scale per weight tensor, 7-bit
    weights against the 16-bit saturation of CPUs without VNNI): 32.8 dB from the float32 output (median over
    the first 20 dev pairs, streamed per hop) against 41.8 dB per block, at about the same speed (``bench/README.md``,
    "int8 weights per block")."""
    from enhance.onnx_graph import quantize_graph

    with atomic_path(dst) as out, _keep_root_logger_bare():
        quantize_graph(src, out)
        # a new model: the float step's record, and what its weights need of onnxruntime
        _write_origin(out, {**_read_origin(src), WEIGHTS_FORMAT_KEY: BLOCKWISE})
    return Path(dst)


def _read_origin(path: str | os.PathLike[str]) -> dict[str, str]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in proto.metadata_props if p.key in ORIGIN_KEYS}


class OnnxStepper(FixedStepper):
    """Runs an exported step with onnxruntime (CPU, ``threads`` intra-op threads), one channel at a time, up to 64
    frames per call (like :class:`enhance.fixed_step.TracedStepper`). ``one_frame``: optionally, the same step
    exported for exactly one new frame (``export_step(..., frames=1)``), which then runs the one-frame calls of a
    per-hop stream (the ``onnxruntime`` backends of :mod:`enhance.backends` use both)."""

    max_frames = 64
    limit_baked_in = True  # the exported graph holds the limit of the model it was exported from

    def __init__(
        self,
        path: str | os.PathLike[str],
        model: Enhancer,
        threads: int = 1,
        one_frame: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(model)
        self.step_bytes = os.path.getsize(path)  # the main step file's size (weights included)
        self.session = _open(path, threads, frames=None)
        _check_origin(path, self.session, model)
        self.one_frame_session = None if one_frame is None else _open(one_frame, threads, frames=1)
        if one_frame is not None:
            _check_origin(one_frame, self.one_frame_session, model)

    def run(self, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        one = self.one_frame_session is not None and feed["feat"].shape[1] == 1
        session = self.one_frame_session if one else self.session
        assert session is not None
        outs = session.run(None, {name: t.numpy() for name, t in feed.items()})
        return [torch.from_numpy(o) for o in outs]

    def _run(
        self, frames: torch.Tensor, state: FixedState, channel: int, mask: torch.Tensor, first_slot: int
    ) -> list[torch.Tensor]:
        """One frame through the one-frame session with the channel's tensors bound to it (an onnxruntime
        IOBinding, made on the channel's first one-frame call and kept in ``state.runners``): no input or output
        is converted or allocated per call: 0.85x the time per 16-ms hop for int8, 0.90x for float (session
        29, ``bench/README.md``, "Bound one-frame calls"). Other calls go through :meth:`run`."""
        if self.one_frame_session is None or frames.shape[1] != 1:
            return super()._run(frames, state, channel, mask, first_slot)
        tensors = state.channels[channel]
        bound = state.runners[channel]
        if (
            not isinstance(bound, _BoundStep)
            or bound.session is not self.one_frame_session
            or not bound.holds(tensors)
        ):
            bound = state.runners[channel] = _BoundStep(self, tensors)
        return bound.run(frames, mask, first_slot)


class _BoundStep:
    """One channel's inputs and outputs bound to a one-frame session: the channel's state tensors (their memory
    is stable for the life of the stream), a feature and a mask buffer filled per call, and an output buffer per
    output. A copy of the stream's state (deepcopy, pickle) does not copy this: the copy binds its own on first
    use, as does a state continued by another stepper (another session)."""

    def __init__(self, stepper: OnnxStepper, tensors: dict[str, torch.Tensor]) -> None:
        assert stepper.one_frame_session is not None
        self.session: Any = stepper.one_frame_session
        self.tensors = dict(tensors)
        self.binding = self.session.io_binding()
        # the buffers are numpy arrays: a small copy costs numpy a third of what it costs torch
        self.feat = np.zeros((1, 1, stepper.n_bins), np.float32)
        self.mask = np.zeros((1, stepper.context + 1), np.float32)
        self.mask_of: torch.Tensor | None = None  # the mask tensor self.mask holds a copy of
        buffers = {"feat": self.feat.ctypes.data, "mask": self.mask.ctypes.data}
        for name, t in self.tensors.items():
            assert t.dtype == torch.float32 and t.is_contiguous(), name
            buffers[name] = t.data_ptr()
        for meta in self.session.get_inputs():
            shape = [1 if isinstance(d, str) else d for d in meta.shape]
            self.binding.bind_input(meta.name, "cpu", 0, np.float32, shape, buffers[meta.name])
        outputs = []
        for meta in self.session.get_outputs():
            out = np.empty([1 if isinstance(d, str) else d for d in meta.shape], np.float32)
            self.binding.bind_output(meta.name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
            outputs.append(out)
        n_head = 1 + stepper.n_maps
        self.head = outputs[:n_head]  # log_mag and the competition maps
        convs = outputs[n_head : n_head + len(stepper.conv_names)]
        self.convs = [(tensors[n].numpy(), new) for n, new in zip(stepper.conv_names, convs, strict=True)]
        # each ring with the new frame's k/v(/u) and the index of a ring slot but for the slot itself
        rings = outputs[n_head + len(stepper.conv_names) :]
        self.rings: list[tuple[np.ndarray, np.ndarray, tuple[Any, ...]]] = [
            (tensors[n].numpy(), new.squeeze(slot_axis(n)), (slice(None),) * slot_axis(n))
            for n, new in zip(stepper.ring_names, rings, strict=True)
        ]

    def holds(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Whether the bound state tensors are still the channel's (the same objects, so the same memory)."""
        return len(tensors) == len(self.tensors) and all(tensors.get(k) is t for k, t in self.tensors.items())

    def run(self, frames: torch.Tensor, mask: torch.Tensor, slot: int) -> list[torch.Tensor]:
        """One frame through the session; the new conv caches and the frame's k/v(/u), into ring slot ``slot``,
        are written to the channel's tensors (as :meth:`FixedStepper._keep_new` does); returns copies of the
        log magnitude and the competition maps."""
        self.feat[...] = frames.numpy()
        if mask is not self.mask_of:  # the host reuses one mask once the ring is full: copied once
            self.mask[...] = mask.numpy()
            self.mask_of = mask
        self.session.run_with_iobinding(self.binding)
        for cache, new in self.convs:
            cache[...] = new
        for ring, new, before_slot in self.rings:
            ring[(*before_slot, slot)] = new
        return [torch.from_numpy(out.copy()) for out in self.head]  # the bound ones change with the next call

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Any, tuple[()]]:  # pickled (a copied stream state): nothing, rebound on use
        return _unbound, ()


def _unbound() -> None:
    return None


def onnx_stepper(model: Enhancer, int8: bool = False, threads: int = 1) -> OnnxStepper:
    """What the ``onnxruntime`` and ``onnxruntime-int8`` backends run: ``model``'s step with a free frame count and
    its one-frame step, exported (and with ``int8`` quantised) to a temporary folder; the sessions keep them in
    memory."""
    with tempfile.TemporaryDirectory() as tmp:
        main = export_step(model, Path(tmp) / "step.onnx", int8=int8)
        one = export_step(model, Path(tmp) / "one.onnx", frames=1, int8=int8)
        return OnnxStepper(main, model, threads=threads, one_frame=one)


def _open(path: str | os.PathLike[str], threads: int, frames: int | None) -> Any:
    """An onnxruntime session of an exported step, refused unless it takes a float mask and ``frames`` new frames
    per call (None: a free number)."""
    import onnxruntime as ort

    from enhance.onnx_graph import require_8bit_kernels

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        # an 8-bit step on an older onnxruntime: say what to install rather than its own error
        if "MatMulNBits" in str(exc):
            require_8bit_kernels()
        raise
    if session.get_modelmeta().custom_metadata_map.get(WEIGHTS_FORMAT_KEY) == BLOCKWISE:
        require_8bit_kernels()  # loaded, but an older onnxruntime may only fail when it runs
    inputs = {i.name: i for i in session.get_inputs()}
    feat, mask = inputs.get("feat"), inputs.get("mask")
    again = "export it again with python -m enhance.onnx_backend (--model/--checkpoint, --int8 as before)"
    if feat is None or mask is None or mask.type != "tensor(float)":
        # files from before the multi-frame export: one frame per call and a boolean mask
        raise ValueError(
            f"{path} is not a step exported by this version of tim-enhance (it needs a float mask): {again}"
        )
    if frames is None and isinstance(feat.shape[1], int):
        raise ValueError(
            f"{path} takes a fixed number of frames ({feat.shape[1]}); the main step needs a free number: {again}"
        )
    if frames is not None and feat.shape[1] != frames:
        raise ValueError(
            f"{path} does not take exactly {frames} frame(s) per call: {again} --frames {frames}"
        )
    return session


def main(argv: list[str] | None = None) -> int:
    """``python -m enhance.onnx_backend --out step.onnx [--model default | --checkpoint PATH] [--frames N] [--int8]``"""
    import argparse

    from models.checkpoint import load_checkpoint
    from models.pretrained import load_pretrained

    ap = argparse.ArgumentParser(description="Export a model's streaming step to ONNX.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", default="default")
    g.add_argument("--checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--frames",
        type=int,
        help="fix the new frames per call (1: OnnxStepper's one_frame file); default free",
    )
    ap.add_argument("--int8", action="store_true", help="int8 weights (the onnxruntime-int8 backend's step)")
    args = ap.parse_args(argv)
    if args.frames is not None and args.frames < 1:
        ap.error("--frames must be at least 1")
    ck = load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained(args.model)
    print(export_step(ck.model, args.out, frames=args.frames, int8=args.int8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
