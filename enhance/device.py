"""``--device`` of enhance-cli, enhance-server, tim-train and tim-evaluate: a torch device this process can really
use, checked before any work (the server once started "healthy" on ``--device cuda`` without CUDA and then refused
every request)."""

from __future__ import annotations

import torch


def usable_device(text: str, *, auto: bool = False, flag: str = "--device") -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps`` as a :class:`torch.device`; ``ValueError`` with one line saying why
    not otherwise (PyTorch's own message lists two dozen device types). ``auto`` (training): also ``auto``, the
    first CUDA device when there is one, else the CPU. ``flag``: the option the messages name."""
    choices = f"use {'auto, ' if auto else ''}cpu, cuda or cuda:N (or mps)"
    if auto and text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"{flag} {text}: {choices}") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{flag} {text}: {choices}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag} {text}: no CUDA device here (this PyTorch: {torch.__version__})")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{flag} {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{flag} {text}: no MPS device here")
    return device


def inference_device(text: str, flag: str = "--device") -> torch.device:
    """:func:`usable_device` for the commands that enhance (enhance-cli, enhance-server, tim-evaluate). On CUDA it
    also turns TF32 off for this process: PyTorch lets cuDNN run float32 convolutions in TF32 (a 10-bit mantissa) by
    default, which put the output about 80 dB under the signal away from the CPU's on an H200 (up to 5 LSB in a
    16-bit file) against about 130 dB with TF32 off (`bench/bench_device.py`, `bench/results/device-cuda*.md`). The
    model is far too small for TF32 to matter to speed. Training (tim-train) keeps PyTorch's defaults."""
    device = usable_device(text, flag=flag)
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return device
