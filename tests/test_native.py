"""The ``native`` streaming backend (the step in C, enhance/native_step.c): the PyTorch numbers, bounded state,
clear errors where it cannot run. (One stepper shared by concurrent streams: tests/test_streaming.py.)"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from enhance import native_backend, native_build
from enhance.native_backend import NativeStepper, native_unsupported
from enhance.offline import enhance_waveform
from enhance.streaming import StreamingEnhancer
from models import Enhancer, get_config, save_checkpoint
from models.attention import AttentionConfig
from models.encoder_layer import StandardLayerConfig
from models.enhancer import EnhancerConfig
from models.pre_encoder import PreEncoderConfig
from models.pretrained import load_pretrained
from models.registry import tiny_config
from models.tim_layer import TIMLayerConfig
from recipes.export import EXAMPLE_NOISY
from tests.conftest import ROOT, reachable_array_bytes
from tests.test_streaming import _config, _sizes, _stream

SUPPORTED = ["tiny", "tiny-direct", "tiny-transformer", "tiny-nocomp", "tiny-tim4"]


def _tiny(name: str, limit: float | None = 12.0) -> Enhancer:
    torch.manual_seed(0)
    return Enhancer(dataclasses.replace(_config(name), max_attenuation_db=limit)).eval()


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.parametrize("chunk", [1, 256, "random"])
@pytest.mark.parametrize("limit", [None, 12.0])
def test_native_backend_equals_pytorch(name: str, chunk, limit: float | None) -> None:
    """Two channels, lengths that are whole hops (768) and not, chunks of 1 sample to hundreds, the ring (4 frames
    in the tiny models) wrapped many times; the competition maps too. tiny-direct: the paper's direct output
    (softplus), which the C step computes in its own branch."""
    model = _tiny(name, limit)
    stepper = NativeStepper(model)
    rng = np.random.default_rng(2)
    for n in (1, 257, 768, 3001):
        x = (rng.standard_normal((2, n)) * 0.1).astype(np.float32)
        ref = enhance_waveform(model, x, return_competition=True)
        engine = StreamingEnhancer(model, 2, with_competition=True, backend=stepper)
        y, _ = _stream(engine, x, _sizes(chunk, np.random.default_rng(1)))
        assert y.shape == x.shape
        assert np.abs(y - ref.wav).max() < 1e-5
        assert ref.competition is not None
        maps = engine.competition()
        assert len(maps) == len(ref.competition)
        for ours, theirs in zip(maps, ref.competition, strict=True):
            assert ours.shape == theirs.shape
            assert np.abs(ours - theirs).max() < 1e-5


def _wide_heads() -> Enhancer:
    """Heads of 16 units and a 37-frame context: the float16 attention's AVX-512 loops (16 frames / 16 units per
    register) and their scalar tails both run, which the tiny models' 4-unit heads and 4-frame rings do not."""
    torch.manual_seed(1)
    attn = AttentionConfig(d_model=32, n_heads=2, context_frames=37)
    tim = TIMLayerConfig(
        attention=AttentionConfig(d_model=32, n_heads=2, n_groups=2, context_frames=37),
        d_ff=32,
        inter_heads=2,
        inter_head_dim=4,
    )
    cfg = EnhancerConfig(
        pre_encoder=PreEncoderConfig(channels=(32, 16, 16, 32)),
        standard=StandardLayerConfig(attention=attn, d_ff=32),
        tim=tim,
        n_layers=3,
        tim_blocks=(2,),
        output="residual",
    )
    return Enhancer(cfg).eval()


def test_reduced_precisions_with_16_unit_heads() -> None:
    model = _wide_heads()
    x = (np.random.default_rng(9).standard_normal((1, 16000)) * 0.1).astype(
        np.float32
    )  # 63 frames: rings wrap
    ref = enhance_waveform(model, x).wav
    for weights, at_least in (("float32", 110.0), ("float16", 60.0), ("int8", 30.0)):
        y = _stream(
            StreamingEnhancer(model, 1, backend=NativeStepper(model, weights=weights)), x, [256] * 63
        )[0]
        assert 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2)) > at_least, weights


@pytest.mark.parametrize("name", ["tiny-tim4", "wide-heads"])
def test_bare_step_equals_the_model_for_any_split(name: str) -> None:
    """NativeStepper.step (features in, log magnitudes out; the engine uses run_frames) against Enhancer.forward,
    several frames per call, the end's zero frame, the competition maps."""
    model = _wide_heads() if name == "wide-heads" else _tiny(name)
    feats = torch.rand(2, 90, 257) * 3
    with torch.no_grad():
        ref = model(feats, return_competition=True)
    assert ref.competition is not None
    stepper = NativeStepper(model)
    for sizes in ([1] * 90, [3] * 29 + [1], [40, 0, 7, 43]):
        state, outs, maps, i = None, [], [], 0
        for n in sizes:
            out, state = stepper.step(feats[:, i : i + n], state, return_competition=True)
            outs.append(out.log_mag)
            maps.extend(out.competition or [])
            i += n
        out, state = stepper.step(feats[:, i:], state, final=True, return_competition=True)
        outs.append(out.log_mag)
        maps.extend(out.competition or [])
        assert state is not None and state.frames_out == 90
        assert (torch.cat(outs, 1) - ref.log_mag).abs().max() < 1e-5
        assert (torch.cat(maps, 1) - ref.competition[0]).abs().max() < 1e-5
    # a state of another precision (float16 rings: smaller) is refused, not written past its end
    with pytest.raises(ValueError, match="not a state of this stepper"):
        stepper.step(feats[:, :1], NativeStepper(model, weights="float16").new_state(2))
    # nor a work buffer of the right length but another type (the C step writes float32 into it)
    wrong = stepper.new_state(2)
    wrong.work = np.zeros(wrong.work.size, np.float16)
    with pytest.raises(ValueError, match="not a state of this stepper"):
        stepper.step(feats[:, :1], wrong)


@pytest.mark.parametrize("weights", ["float32", "float16", "int8"])
def test_output_does_not_depend_on_the_chunking(weights: str) -> None:
    """The C step runs up to 16 frames through each matrix product together (the weights read once for all of
    them); a frame's arithmetic is the same alone or in a batch, so any split of the frames into calls, and any
    chunking of the engine's samples, gives the same bits. 16-unit heads and 37-frame rings: the reduced modes'
    converted-rows path and the AVX-512 loops run (where the CPU has them)."""
    model = _wide_heads()
    stepper = NativeStepper(model, weights=weights)
    feats = torch.rand(2, 90, 257) * 3
    outs = []
    for sizes in ([1] * 90, [40, 0, 7, 43], [90], [16, 17, 15, 42]):
        state, parts, i = None, [], 0
        for n in [*sizes, None]:  # None: the end (the zero lookahead frame)
            out, state = stepper.step(feats[:, i : i + (n or 0)], state, final=n is None)
            parts.append(out.log_mag)
            i += n or 0
        outs.append(torch.cat(parts, 1))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    x = (np.random.default_rng(4).standard_normal((1, 12000)) * 0.1).astype(np.float32)
    ys = [
        _stream(StreamingEnhancer(model, 1, backend=stepper), x, c)[0]
        for c in ([256] * 47, [5000, 7000], [12000])
    ]
    assert all(np.array_equal(ys[0], y) for y in ys[1:])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 build flags")
@pytest.mark.parametrize("weights", ["float32", "float16", "int8"])
@pytest.mark.parametrize("flag", ["-mno-avx512f", "-mno-avx"])
def test_builds_for_other_vector_extensions_give_the_same_numbers(
    weights: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-march=native` picks what the CPU has, so each machine runs one of three builds: AVX-512 (tiled products
    of 16 floats), AVX2 with FMA and F16C (most laptops and AMD EPYC servers: the same kernels 8 floats wide) or
    plain C (float32 rows four at a time, scalar attention over float16 rings). The other two are built here
    with a flag that takes the extensions away: the same numbers within float rounding, and still independent of
    the chunking."""
    model = _wide_heads()
    x = (np.random.default_rng(4).standard_normal((1, 6000)) * 0.1).astype(np.float32)
    engine = StreamingEnhancer(model, 1, backend=NativeStepper(model, weights=weights))
    ref = _stream(engine, x, [256] * 24)[0]
    monkeypatch.setenv("TIM_ENHANCE_CACHE", str(tmp_path))
    monkeypatch.setattr(native_build, "FLAGS", (*native_build.FLAGS, flag))
    native_backend.library.cache_clear()
    try:
        stepper = NativeStepper(model, weights=weights)
        assert [p.name for p in tmp_path.glob("native_step-*.so")]  # built here, with the flag
        ys = [_stream(StreamingEnhancer(model, 1, backend=stepper), x, c)[0] for c in ([256] * 24, [6000])]
    finally:
        native_backend.library.cache_clear()
    assert np.array_equal(ys[0], ys[1])
    assert np.abs(ys[0] - ref).max() < 1e-5
    if weights == "float32":
        assert np.abs(ys[0] - enhance_waveform(model, x).wav).max() < 1e-5


def test_native_backend_reads_the_attenuation_limit_at_every_call() -> None:
    """Like Enhancer.forward, a limit set after the stepper was made applies (and changes the output)."""
    model = _tiny("tiny", None)
    stepper = NativeStepper(model)
    x = (np.random.default_rng(4).standard_normal((1, 3000)) * 0.1).astype(np.float32)
    free = _stream(StreamingEnhancer(model, 1, backend=stepper), x, [256] * 20)[0]
    model.set_max_attenuation(3.0)
    limited = _stream(StreamingEnhancer(model, 1, backend=stepper), x, [256] * 20)[0]
    assert np.abs(limited - enhance_waveform(model, x).wav).max() < 1e-5
    assert np.abs(limited - free).max() > 1e-3


def test_default_model_float32_float16_and_int8() -> None:
    """The bundled model over 6 s of the example clip (375 frames: its 250-frame rings wrap): float32 equals
    PyTorch; float16 and int8 weights (with float16 rings) are close but really not the same numbers.

    Speech in noise, not noise alone: on white noise the model's output is the attenuation floor, 30 dB under
    the input, and the reduced weights' errors measured against so little signal say more about the weights'
    suppression than about the kernels (stage 6: float16 77 dB, int8 44; stage 7, which suppresses noise more
    deeply, 64 and 40; on this clip both 80-82 and 47-48)."""
    model = load_pretrained().model.eval()
    rng = np.random.default_rng(5)
    wav, _ = sf.read(EXAMPLE_NOISY, dtype="float32")
    x = np.ascontiguousarray(wav[None, : 6 * 16000])
    assert x.shape == (1, 6 * 16000)
    ref = enhance_waveform(model, x).wav
    snr = {}
    for weights in ("float32", "float16", "int8"):
        engine = StreamingEnhancer(model, 1, backend=NativeStepper(model, weights=weights))
        y = _stream(engine, x, _sizes(256, rng))[0]
        snr[weights] = 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2))
        if weights == "float32":
            assert np.abs(y - ref).max() < 1e-5
    # On this clip: stage 7 (session 38) 81.7 dB for float16 and 47.3 for int8, stage 6 80.4 and 48.3. On the
    # white noise this test used before (0.05 RMS), when written: 134, 84 and 47 dB (onnxruntime-int8, which also
    # quantises the activations: 36 dB); with the session-11 weights 126, 73 and 37 dB (int8 on the 120 dev
    # pairs: 45.5 dB median, 33.8 the lowest, scores unchanged: bench/results/native-int8/summary.md).
    # Why these bands: float16 keeps 11 significant bits, an RMS rounding error of 2^-11 / sqrt(3) of each
    # weight, about -71 dB; int8 with one scale per output column rounds to steps of (column max) / 127, an RMS
    # error of step / sqrt(12), about -53 dB of the column's largest weight. Through the network the output lands
    # near those figures (above: float16's rings and the log1p output compress the errors). The upper bounds say
    # the reduced weights are really used (float32 gives more than 110 dB); the lower bounds sit a few dB under
    # every measurement, so a kernel that loses precision (a wrong scale, a truncated ring) fails.
    assert snr["float32"] > 110.0
    assert 70.0 < snr["float16"] < 110.0
    assert 30.0 < snr["int8"] < 70.0


def test_digital_silence_then_noise_equals_offline() -> None:
    """Exact zeros (zero spectra, whose phase is defined as 0) then noise: an untrained tiny model outputs energy
    in the silence, so the C signal path's phase rule for zero bins really decides those samples."""
    model = _tiny("tiny", None)
    x = np.zeros((1, 4000), np.float32)
    x[:, 2000:] = np.random.default_rng(8).standard_normal(2000) * 0.1
    ref = enhance_waveform(model, x).wav
    assert np.abs(ref[:, :1500]).max() > 1e-2
    for weights, tolerance in (("float32", 1e-5), ("float16", 1e-3), ("int8", 1e-2)):
        y = _stream(
            StreamingEnhancer(model, 1, backend=NativeStepper(model, weights=weights)), x, [100] * 40
        )[0]
        assert np.abs(y - ref).max() < tolerance


def test_run_frames_refuses_state_arrays_of_the_wrong_kind() -> None:
    model = _tiny("tiny")
    stepper = NativeStepper(model)
    state = stepper.new_state(1)
    samples = np.zeros((1, 512), np.float32)
    pending, tail = np.zeros((1, 257), np.complex64), np.zeros((1, 256), np.float32)
    stepper.run_frames(samples, 1, False, state, pending, tail)  # the right kinds: no error
    with pytest.raises(ValueError, match="complex64"):
        stepper.run_frames(samples, 1, False, state, pending.astype(np.complex128), tail)
    with pytest.raises(ValueError, match=r"float32 array \[1, 256\]"):
        stepper.run_frames(samples, 1, False, state, pending, tail[:, :128])
    with pytest.raises(ValueError, match="2 frames need 768 samples"):
        stepper.run_frames(samples, 2, False, state, pending, tail)


def test_state_is_fixed_size() -> None:
    model = _tiny("tiny")
    stepper = NativeStepper(model)
    engine = StreamingEnhancer(model, 1, backend=stepper)
    x = (np.random.default_rng(6).standard_normal((1, 16000)) * 0.1).astype(np.float32)
    engine.process(x[:, :4000])
    sizes = (engine.state.model.floats.shape, engine.state.model.work.shape)
    for _ in range(20):
        engine.process(x)
    assert (engine.state.model.floats.shape, engine.state.model.work.shape) == sizes
    assert engine.state.model.frames_out > 1000  # the counters run on; the rings do not grow
    # native-fp16 and native-int8 keep the key/value rings in float16: a stream's state is about half the size
    rings = 2 * model.cfg.context_frames * model.cfg.d_model * len(model.layers)
    for weights in ("float16", "int8"):
        assert stepper.state_floats - NativeStepper(model, weights=weights).state_floats == rings // 2
    with pytest.raises(ValueError, match="weights must be one of float32, float16, int8"):
        NativeStepper(model, weights="bfloat16")


def test_memory_stays_the_same_from_one_hour_to_two() -> None:
    """Two hours of audio through the C step in 10-s chunks (about 10 s here): every array and tensor reachable
    from the engine (its state, the stepper, the model) adds up to the same bytes after the first hour and after
    the second, and the output stays finite."""
    model = _tiny("tiny")
    engine = StreamingEnhancer(model, 1, backend=NativeStepper(model))
    rng = np.random.default_rng(7)
    # 10 s, 1 sample less and 1 more: the hop phase moves from chunk to chunk, and is the same at each hour's end
    chunks = [(rng.standard_normal((1, 160000 + d)) * 0.1).astype(np.float32) for d in (0, -1, 1)]
    arrays_bytes = []
    for _hour in (1, 2):  # after each hour of audio (360 chunks)
        for i in range(360):
            y = engine.process(chunks[i % 3])
            assert np.isfinite(y).all() and y.shape[1] > 0
        arrays_bytes.append(reachable_array_bytes(engine))
    assert engine.state.received == 2 * 3600 * 16000
    assert arrays_bytes[0] == arrays_bytes[1], arrays_bytes
    assert arrays_bytes[0] > 4 * sum(p.numel() for p in model.parameters())  # the walk reached the weights


@pytest.mark.parametrize("name", ["tiny+sdu", "tiny+highway", "tiny+mae", "tiny-transformer+mae"])
def test_refuses_models_it_does_not_cover(name: str) -> None:
    from enhance.backends import resolve_backend

    model = _tiny(name)
    assert native_unsupported(model) is not None
    with pytest.raises(ValueError, match="SDU or MAE"):
        NativeStepper(model)
    with pytest.raises(ValueError, match="use the pytorch backend: --stream-backend pytorch"):
        resolve_backend(model, "native")
    assert resolve_backend(model, "auto") == "torchscript"  # auto takes native only where it covers the model
    no_lookahead = dataclasses.replace(
        tiny_config(2), pre_encoder=dataclasses.replace(tiny_config(2).pre_encoder, lookahead_frames=0)
    )
    with pytest.raises(ValueError, match="lookahead"):
        NativeStepper(Enhancer(no_lookahead))


def test_without_a_compiler_the_cli_says_so(tmp_path: Path) -> None:
    """No compiled library in the cache and no compiler: ``auto`` streams on TorchScript; ``native`` named is exit
    2 with the reason, no output file."""
    torch.manual_seed(0)
    ck = tmp_path / "tiny.safetensors"
    save_checkpoint(ck, Enhancer(get_config("tiny")), "tiny")
    src = tmp_path / "in.wav"
    sf.write(src, (np.random.default_rng(0).standard_normal(4000) * 0.1).astype(np.float32), 16000)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CC": str(tmp_path / "no-such-cc"),
        "TIM_ENHANCE_CACHE": str(tmp_path / "cache"),
    }
    # the default backend (auto) falls back to TorchScript: the command works and builds nothing
    auto = ["--stream", str(src), "-o", str(tmp_path / "auto.wav"), "--checkpoint", str(ck)]
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *auto], capture_output=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "auto.wav").exists() and not list(tmp_path.glob("cache/native_step-*.so"))
    args = ["--stream", "--stream-backend", "native", str(src), "-o", str(tmp_path / "o.wav"), "--checkpoint"]
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args, str(ck)], capture_output=True, env=env, timeout=300
    )
    assert proc.returncode == 2
    assert b"needs a C compiler" in proc.stderr
    assert not (tmp_path / "o.wav").exists()
    # with the compiler the same command works, and builds into the cache it was given
    env["CC"] = "cc"
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args, str(ck)], capture_output=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr.decode()
    (built,) = (tmp_path / "cache").glob("native_step-*.so")
    assert built.stat().st_mode & 0o055 == 0o055  # other users of a shared cache may load it
    # a build that is there but cannot be loaded (a noexec mount, another user's file, a damaged one): auto
    # falls back as without a compiler, the named backend is exit 2 with the reason
    built.write_bytes(b"not a shared object")
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *auto, "--overwrite"], capture_output=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr.decode()
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args, str(ck), "--overwrite"],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2 and b"cannot load the native step" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_a_server_whose_native_build_cannot_load_streams_on_torchscript(tmp_path: Path) -> None:
    """``auto`` falls back when the cached library is there but cannot be loaded: the server gets ready and
    says which backend its streams use (this once failed the model load with an UnboundLocalError)."""
    from tests.server_fixtures import ServerProcess

    key_probe = tmp_path / "probe"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIM_ENHANCE_CACHE": str(key_probe), "OMP_NUM_THREADS": "1"}
    code = "from enhance.native_backend import library; library()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300)
    (built,) = key_probe.glob("native_step-*.so")
    built.write_bytes(b"not a shared object")
    ck = tmp_path / "tiny.safetensors"
    torch.manual_seed(0)
    save_checkpoint(ck, Enhancer(get_config("tiny")), "tiny")
    server = ServerProcess(
        [sys.executable, "-m", "server.main", "--checkpoint", str(ck), "--threads", "1"], env=env
    )
    proc = server.proc
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=server.url(), timeout=10) as c:
            while (ready := c.get("/readyz")).json()["status"] == "loading":
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            assert ready.status_code == 200, ready.text
            assert c.get("/v1/models").json()["models"][0]["stream_backend"] == "torchscript"
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in server.stderr()


def test_without_a_compiler_the_server_refuses_to_start(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CC": str(tmp_path / "no-such-cc"),
        "TIM_ENHANCE_CACHE": str(tmp_path / "cache"),
    }
    cmd = [sys.executable, "-m", "server.main", "--port", "0", "--stream-backend", "native-fp16"]
    proc = subprocess.run(cmd, capture_output=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert b"stream backend native-fp16: the native backend needs a C compiler" in proc.stderr
