"""The streaming engine: sample-for-sample equal to offline, bounded state, measured latency."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from enhance.dc_blocker import remove_dc
from enhance.offline import enhance_waveform
from enhance.streaming import StreamingEnhancer
from models import Enhancer, get_config
from models.enhancer import EnhancerConfig, EnhancerState
from models.registry import paper_config, tiny_config

TINY = [  # streamed on every backend that takes them (tests/test_native.py: the C step's list)
    "tiny",
    "tiny-direct",
    "tiny-transformer",
    "tiny-nocomp",
    "tiny-tim4",
    "tiny+sdu",
    "tiny+highway",
    "tiny+mae",
    "tiny-transformer+mae",
]


def _config(name: str) -> EnhancerConfig:
    """A registry config, or ``tiny-direct``: the tiny model with the paper's direct output (softplus(head(h)),
    the output of ``tim-direct``, which the registry has at paper size only)."""
    if name == "tiny-direct":
        return dataclasses.replace(get_config("tiny"), output="direct")
    return get_config(name)


def _model(name_or_cfg, seed: int = 0) -> Enhancer:
    torch.manual_seed(seed)
    cfg = _config(name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg
    return Enhancer(cfg).double().eval()


def _stream(engine: StreamingEnhancer, x: np.ndarray, sizes) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    outs, maps, i = [], [], 0
    for k in sizes:
        if i >= x.shape[1]:
            break
        outs.append(engine.process(x[:, i : i + k]))
        maps.append(engine.last_competition)
        i += k
    assert i >= x.shape[1]
    outs.append(engine.flush())
    maps.append(engine.last_competition)
    return np.concatenate(outs, axis=1), maps


def _sizes(kind, rng: np.random.Generator):
    while True:
        yield int(rng.integers(0, 700)) if kind == "random" else kind


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("chunk", [1, 7, 256, 1000, "random"])
def test_streaming_equals_offline(name: str, chunk) -> None:
    model = _model(name)
    rng = np.random.default_rng(1)
    for n in (1, 257, 2560, 3001) if chunk != 1 else (1, 1283, 1536):  # 2560, 1536: whole hops
        x = (rng.standard_normal((2, n)) * 0.1).astype(np.float32)
        ref = enhance_waveform(model, x, return_competition=True)
        y, maps = _stream(StreamingEnhancer(model, 2, with_competition=True), x, _sizes(chunk, rng))
        assert y.shape == x.shape
        assert np.abs(y - ref.wav).max() < 1e-6, (n, np.abs(y - ref.wav).max())
        assert ref.competition is not None
        if ref.competition:  # frames' competition scores, in order, as offline
            got = np.concatenate([m[0] for m in maps if m], axis=1)
            assert np.abs(got - ref.competition[0]).max() < 1e-9


@pytest.mark.parametrize("n_mech", [1, 2, 4])
def test_paper_sized_model_streams_like_offline(n_mech: int) -> None:
    cfg = dataclasses.replace(
        paper_config(n_mech, context_frames=6), max_attenuation_db=12.0 if n_mech == 2 else None
    )
    model = _model(cfg)
    x = (np.random.default_rng(2).standard_normal((1, 5000)) * 0.1).astype(np.float32)
    ref = enhance_waveform(model, x).wav
    y, _ = _stream(StreamingEnhancer(model), x, _sizes(300, np.random.default_rng(0)))
    assert np.abs(y - ref).max() < 1e-6


def test_model_step_equals_forward_for_any_split() -> None:
    model = _model("tiny")
    x = torch.rand(2, 40, 257, dtype=torch.float64) * 3
    with torch.no_grad():
        ref = model(x, return_competition=True)
        for sizes in ([1] * 40, [3] * 13 + [1], [40], [7, 0, 5, 28]):
            state, outs, maps, i = EnhancerState(), [], [], 0
            for n in sizes:
                out, state = model.step(x[:, i : i + n], state, return_competition=True)
                outs.append(out.log_mag)
                maps.extend(out.competition or [])
                i += n
            out, state = model.step(x[:, i:], state, final=True, return_competition=True)
            outs.append(out.log_mag)
            maps.extend(out.competition or [])
            assert torch.allclose(torch.cat(outs, 1), ref.log_mag, atol=1e-12)
            assert ref.competition is not None
            assert torch.allclose(torch.cat(maps, 1), ref.competition[0], atol=1e-12)
            assert state.frames_out == 40


def _state_sizes(engine: StreamingEnhancer) -> tuple:
    st = engine.state
    assert st.model.kv is not None and st.model.conv is not None and st.spectra is not None
    return (
        st.buffer.shape,
        tuple(st.spectra.shape),
        tuple(tuple(c.shape) for c in st.model.conv),
        tuple(tuple(kv.k.shape) for kv in st.model.kv),
        tuple(None if kv.u is None else tuple(kv.u.shape) for kv in st.model.kv),  # MAE gate inputs
        None if st.model.pending is None else tuple(st.model.pending.shape),
    )


@pytest.mark.parametrize("name", ["tiny", "tiny+mae"])
def test_state_stays_bounded_over_a_long_stream(name: str) -> None:
    model = _model(name).float()
    engine = StreamingEnhancer(model)
    rng = np.random.default_rng(3)
    chunk = (rng.standard_normal((1, 16000 * 10)) * 0.1).astype(np.float32)
    sizes = []
    for i in range(60):  # 10 minutes of audio in 10-s chunks
        engine.process(chunk)
        if i in (5, 59):
            sizes.append(_state_sizes(engine))
    assert sizes[0] == sizes[1]
    kv_frames = [s[2] for s in sizes[1][3]] + [s[2] for s in sizes[1][4] if s is not None]
    assert max(kv_frames) <= model.cfg.context_frames
    assert (name == "tiny+mae") == any(s is not None for s in sizes[1][4])
    assert engine.state.buffer.shape[1] < model.cfg.stft.win_length


def test_latency_matches_the_documented_formula() -> None:
    """Feed one sample at a time and record when each output sample comes out."""
    engine = StreamingEnhancer(_model("tiny").float())
    x = (np.random.default_rng(4).standard_normal((1, 2000)) * 0.1).astype(np.float32)
    emitted_at = np.full(2000, -1)
    done = 0
    for i in range(2000):
        out = engine.process(x[:, i : i + 1])
        emitted_at[done : done + out.shape[1]] = i + 1  # input samples received when it came out
        done += out.shape[1]
    s = np.arange(done)
    assert done > 1000
    assert np.array_equal(emitted_at[:done], np.minimum(s + 768 - s % 256, 2000))
    delay = emitted_at[:done] - s
    assert delay.max() == engine.latency_samples == 768 and engine.latency_ms == 48.0
    assert delay.min() == 513


def _identity(model: Enhancer) -> Enhancer:
    """``model`` (residual output) with its output head zeroed: relu(noisy log magnitude + 0) is the noisy log
    magnitude (>= 0), which with the noisy phase and the sqrt-Hann overlap-add rebuilds the input."""
    assert model.cfg.output == "residual"
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    return model


@pytest.mark.parametrize("backend", ["pytorch", "native"])
def test_an_impulse_comes_back_at_its_sample_after_the_reported_latency(backend: str) -> None:
    """The impulse response of the stream through an identity model, fed one sample per call and read as it comes
    out (nothing compensated): an impulse at input sample k comes back as output sample k, followed only by the
    DC blocker's small decaying tail (enhance.dc_blocker: the identity rebuilds the blocked input), and
    is returned once k + d input samples have arrived, d = latency_samples - k % hop (the engine's definition:
    a window plus the lookahead, less the part of the current hop already received). An impulse at the start of
    a hop shows the reported latency itself, 768 samples = 48 ms; the shortest delay is one sample over a hop
    less (513)."""
    from enhance.backends import streaming_backend

    model = _identity(_model("tiny").float())
    noise = (np.random.default_rng(8).standard_normal((1, 3000)) * 0.1).astype(np.float32)
    hop, rate = model.cfg.stft.hop_length, model.cfg.stft.sample_rate
    # the model is an identity of what the DC blocker passes (below 5 Hz, nothing)
    assert np.abs(enhance_waveform(model, noise).wav - remove_dc(noise, hop)).max() < 1e-5
    stepper = streaming_backend(model, backend)
    delays = {}
    for k in (0, 1, 100, 255, 256, 300, 511, 512, 767, 768, 1000):
        engine = StreamingEnhancer(model, backend=stepper)
        n = k + engine.latency_samples + 300
        x = np.zeros((1, n), np.float32)
        x[0, k] = 0.5
        pieces, arrived = [], []  # arrived[s]: input samples received when output sample s was returned
        for i in range(n):
            piece = engine.process(x[:, i : i + 1])
            pieces.append(piece)
            arrived += [i + 1] * piece.shape[1]
        y = np.concatenate(pieces, axis=1)[0]
        blocked = remove_dc(x, hop)[
            0
        ]  # 0.4995 at k, then a tail from -5e-4 decaying with a 32-ms time constant
        assert len(y) > k and int(np.argmax(np.abs(y))) == k, (k, np.argmax(np.abs(y)))
        assert abs(y[k] - 0.5) < 1e-3 and np.abs(y[:k]).max(initial=0.0) < 1e-5
        assert np.abs(y - blocked[: len(y)]).max() < 1e-5 and np.abs(np.delete(y, k)).max() < 1e-3
        delays[k] = arrived[k] - k
        rest = engine.flush()[0]  # the whole stream is the (blocked) input
        assert np.abs(np.concatenate([y, rest]) - blocked).max() < 1e-5
    assert delays == {k: engine.latency_samples - k % hop for k in delays}, delays
    assert engine.latency_samples == 768 and engine.latency_ms == 48.0
    assert delays[0] == delays[256] == delays[512] == delays[768] == engine.latency_samples
    assert max(delays.values()) * 1000.0 / rate == engine.latency_ms
    assert min(delays.values()) == delays[255] == engine.latency_samples - hop + 1 == 513


def test_flush_resets_for_the_next_stream() -> None:
    model = _model("tiny")
    engine = StreamingEnhancer(model)
    x = (np.random.default_rng(5).standard_normal((1, 1500)) * 0.1).astype(np.float32)
    a = np.concatenate([engine.process(x), engine.flush()], axis=1)
    b = np.concatenate([engine.process(x), engine.flush()], axis=1)
    assert np.array_equal(a, b)
    engine = StreamingEnhancer(model, with_competition=True)
    engine.process(x)
    engine.flush()
    maps = engine.competition()
    assert maps and maps[0].shape[1] == 7  # ceil(1500 / 256) + 1 frames
    assert engine.flush().shape == (1, 0)  # a second flush: nothing, and the last stream's maps stay readable
    assert all(np.array_equal(m, n) for m, n in zip(engine.competition(), maps, strict=True))
    assert engine.process(np.zeros((1, 0), np.float32)).shape == (1, 0)  # an empty chunk (it cleared them)
    assert all(np.array_equal(m, n) for m, n in zip(engine.competition(), maps, strict=True))
    engine.process(x[:, :600])  # audio starts the next stream, with maps of its own
    assert engine.competition()[0].shape[1] == 1  # the frames output so far: (600 - 256) // 256


def test_calls_from_two_threads_are_serialised_and_lose_nothing() -> None:
    """An audio thread feeding chunks while a control thread flushes (push-to-talk): every sample sent comes back
    exactly once. The state was replaced under a running process(), which then lost up to 70 % of the output."""
    import threading

    engine = StreamingEnhancer(_model("tiny"))
    chunks = [np.full((1, 160), 0.01 * (k % 7), np.float32) for k in range(400)]
    out: list[np.ndarray] = []
    fed = threading.Event()

    def audio() -> None:
        for c in chunks:
            out.append(engine.process(c))
        fed.set()

    def control() -> None:
        while not fed.is_set():
            out.append(engine.flush())

    threads = [threading.Thread(target=audio), threading.Thread(target=control)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.append(engine.flush())
    assert sum(o.shape[1] for o in out) == 400 * 160


def test_a_checkpoint_in_place_of_its_model_says_what_to_pass(tmp_path) -> None:
    """load_pretrained() returns a Checkpoint; passing it failed with "'Checkpoint' object has no attribute 'cfg'"."""
    from enhance.backends import streaming_backend
    from enhance.offline import enhance_audio
    from models import Checkpoint

    model = _model("tiny")
    ckpt = Checkpoint(model=model, name="tiny")
    for call in (
        lambda: StreamingEnhancer(ckpt),
        lambda: streaming_backend(ckpt),
        lambda: enhance_audio(ckpt, np.zeros((1, 100), np.float32), 16000),
    ):
        with pytest.raises(TypeError, match=r"got Checkpoint; pass its \.model"):
            call()


def test_a_stream_without_a_frame_has_empty_maps_per_block() -> None:
    """No samples at all (one sample at 48 kHz resamples to none): one [C, 0, n_s] map per TIM block, not an
    empty list, which callers took for a model without competition (the server's /v1/analyze answered 500)."""
    model = _model("tiny")
    engine = StreamingEnhancer(model, channels=2, with_competition=True)
    assert engine.flush().shape == (2, 0)
    maps = engine.competition()
    assert len(maps) == len(model.competition_blocks) > 0
    assert all(m.shape == (2, 0, model.cfg.tim.attention.n_groups) for m in maps), [m.shape for m in maps]
    assert StreamingEnhancer(model).competition() == []  # not asked for: none


def test_bad_chunks_are_refused() -> None:
    engine = StreamingEnhancer(_model("tiny"), channels=2)
    with pytest.raises(ValueError, match=r"expected \[2, n\]"):
        engine.process(np.zeros((1, 10), np.float32))
    with pytest.raises(ValueError, match=r"got \(160, 2\) \(for \[n, channels\] arrays.*pass chunk.T\)"):
        engine.process(np.zeros((160, 2), np.float32))  # soundfile's and sounddevice's layout
    bad = np.zeros((2, 10), np.float32)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        engine.process(bad)
    with pytest.raises(ValueError, match="integer PCM: divide by 32768"):
        engine.process(np.zeros((2, 10), np.int16))
    huge = np.zeros((2, 10))
    huge[0, 2] = 1e39  # finite in float64, inf once cast to float32: NaN to the end of the stream
    with pytest.raises(ValueError, match="1 sample\\(s\\) beyond ±1000"):
        engine.process(huge)
    assert engine.state.received == 0  # nothing refused was taken in
    assert engine.process(torch.zeros(2, 300)).shape[0] == 2  # a tensor is taken as an array
    with pytest.raises(ValueError, match="channels must be an integer from 1 to 64"):
        StreamingEnhancer(_model("tiny"), channels=0)


@pytest.mark.parametrize("name", TINY)
def test_onnx_backend_equals_pytorch(tmp_path, name: str) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from enhance.onnx_backend import OnnxStepper, export_step

    torch.manual_seed(0)
    limit = 12.0 if name == "tiny" else None  # the attenuation limit is part of the exported step
    model = Enhancer(dataclasses.replace(_config(name), max_attenuation_db=limit)).eval()
    path = export_step(model, tmp_path / "step.onnx")
    one = export_step(model, tmp_path / "one.onnx", frames=1)
    assert not model.training  # exporting must not switch dropout on
    x = (np.random.default_rng(6).standard_normal((2, 2900)) * 0.1).astype(np.float32)
    ref = enhance_waveform(model, x, return_competition=True)
    calls = {"free": 0, "one": 0}

    def counted(run, key: str):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return run(*args, **kwargs)

        return wrapper

    with_one = OnnxStepper(path, model, one_frame=one)
    assert with_one.one_frame_session is not None
    with_one.session.run = counted(with_one.session.run, "free")  # type: ignore[method-assign]
    one_session = with_one.one_frame_session  # one-frame calls run with the channel's tensors bound to it
    one_session.run_with_iobinding = counted(one_session.run_with_iobinding, "one")  # type: ignore[method-assign]
    for backend in (OnnxStepper(path, model), with_one):
        engine = StreamingEnhancer(model, 2, with_competition=True, backend=backend)
        for n, chunk in ((1, 333), (2900, 256), (2900, 333)):  # 256: one frame per call, the one-frame step's
            y, _ = _stream(engine, x[:, :n], _sizes(chunk, np.random.default_rng(0)))
            assert np.abs(y - enhance_waveform(model, x[:, :n]).wav).max() < 1e-5
            if backend is with_one and chunk == 256:
                assert calls["one"] > 0 and calls["free"] <= 4  # the end's padding may come with a frame
        if ref.competition:
            assert np.abs(engine.competition()[0] - ref.competition[0]).max() < 1e-5
    assert calls["free"] > 4  # 333-sample chunks: mostly 1 or 2 frames per call


def test_onnx_one_frame_bindings_follow_the_stream_state(tmp_path) -> None:
    """The one-frame calls run with each channel's tensors bound to the session (kept in the stream's state):
    a copy of the state (deepcopy) continues as the original does, a reset stream starts afresh, and both give
    the offline samples."""
    import copy

    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from enhance.onnx_backend import OnnxStepper, export_step

    model = Enhancer(_config("tiny")).eval()
    backend = OnnxStepper(
        export_step(model, tmp_path / "step.onnx"),
        model,
        one_frame=export_step(model, tmp_path / "one.onnx", frames=1),
    )
    x = (np.random.default_rng(8).standard_normal((2, 6000)) * 0.1).astype(np.float32)
    want = enhance_waveform(model, x).wav
    engine = StreamingEnhancer(model, 2, backend=backend)
    head = np.concatenate([engine.process(x[:, i : i + 256]) for i in range(0, 3072, 256)], axis=1)
    assert all(r is not None for r in engine.state.model.runners)  # bound on the first one-frame call
    saved = copy.deepcopy(engine.state)
    assert saved.model.runners == [None, None]  # a copy binds its own tensors
    tails = []
    for state in (engine.state, saved):
        engine.state = state
        pieces = [engine.process(x[:, i : i + 256]) for i in range(3072, x.shape[1], 256)]
        tails.append(np.concatenate([*pieces, engine.flush()], axis=1))
    assert np.array_equal(tails[0], tails[1])
    assert np.abs(np.concatenate([head, tails[0]], axis=1) - want).max() < 1e-5
    again, _ = _stream(engine, x, _sizes(256, np.random.default_rng(0)))  # after flush: a new state
    assert np.abs(again - want).max() < 1e-5


def test_a_bound_state_continued_by_another_stepper_runs_that_steppers_step(tmp_path) -> None:
    """A stream state that ran on one OnnxStepper and is continued by another (another attenuation limit baked
    into its graph) gets that stepper's numbers, as an unbound copy of the state does; steps inside and outside
    torch.inference_mode mix (the bound buffers were inference tensors), and a state pickles (found by a
    review of the bindings)."""
    import copy
    import pickle

    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from enhance.onnx_backend import OnnxStepper, export_step

    def stepper(limit: float | None, name: str) -> OnnxStepper:
        torch.manual_seed(0)
        model = Enhancer(dataclasses.replace(_config("tiny"), max_attenuation_db=limit)).eval()
        main, one = (
            export_step(model, tmp_path / f"{name}.onnx"),
            export_step(model, tmp_path / f"{name}1.onnx", frames=1),
        )
        return OnnxStepper(main, model, one_frame=one)

    a, b = stepper(0.0, "a"), stepper(None, "b")  # 0 dB: no attenuation at all, unlike b
    feats = torch.rand(1, 12, a.n_bins) * 3
    state = a.new_state(1)
    with torch.inference_mode():
        for t in range(2):
            _, state = a.step(feats[:, t : t + 1], state)
    _, state = a.step(feats[:, 2:3], state)  # outside inference mode, the ring still filling: a new mask
    unbound = copy.deepcopy(state)
    assert unbound.runners == [None] and pickle.loads(pickle.dumps(state)).runners == [None]
    for t in range(3, 8):
        got, state = b.step(feats[:, t : t + 1], state)
        want, unbound = b.step(feats[:, t : t + 1], unbound)
        assert torch.equal(got.log_mag, want.log_mag)
    on_a, _ = a.step(feats[:, 8:9], copy.deepcopy(unbound))
    on_b, _ = b.step(feats[:, 8:9], copy.deepcopy(unbound))
    assert (on_a.log_mag - on_b.log_mag).abs().max() > 0.01  # the two graphs differ (so the check can fail)


def test_int8_backend_is_close_to_float_on_the_default_model_and_really_quantised(
    tmp_path, monkeypatch
) -> None:
    """``onnxruntime-int8``: the trained default model's step with 8-bit blockwise weights. Its output on the
    example file stays within 38 dB (signal to difference) of the float step's, but is not the float output (the
    weights really are 8-bit codes); the same holds for the backend by name, whose one-frame int8 step runs these one-hop
    chunks; and the quantiser leaves the root logger as it found it."""
    import logging
    from pathlib import Path

    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    import soundfile as sf

    from enhance.backends import streaming_backend
    from enhance.onnx_backend import OnnxStepper, export_step, quantize_step
    from models.pretrained import load_pretrained

    model = load_pretrained("default").model
    root = logging.getLogger()
    monkeypatch.setattr(
        root, "handlers", []
    )  # a process that set up no logging (pytest's capture is on root)
    monkeypatch.setattr(root, "level", logging.WARNING)
    float_path = export_step(model, tmp_path / "step.onnx")
    int8_path = quantize_step(float_path, tmp_path / "step-int8.onnx")
    assert root.handlers == [] and root.level == logging.WARNING  # the quantiser's logging installed nothing
    graph = onnx.load(str(int8_path)).graph
    constants = {t.name for t in graph.initializer}
    products = [n for n in graph.node if n.op_type in ("MatMul", "Gemm", "MatMulNBits")]
    assert {n.op_type for n in products if n.input[1] in constants} == {"MatMulNBits"}  # none left in float
    chosen = ("bits", "block_size", "accuracy_level")
    settings = {(a.name, a.i) for n in products for a in n.attribute if a.name in chosen}
    assert settings == {("bits", 8), ("block_size", 32), ("accuracy_level", 4)}  # 4: int8 products
    sizes = {onnx.TensorProto.UINT8: 0, onnx.TensorProto.FLOAT: 0}
    for t in graph.initializer:
        sizes[t.data_type] = sizes.get(t.data_type, 0) + int(np.prod(t.dims))
    # the weights (the conv weights too) are 8-bit codes; float32 holds their scales (1 per 32), biases, gains
    assert sizes[onnx.TensorProto.FLOAT] < 0.05 * sizes[onnx.TensorProto.UINT8]
    assert int8_path.stat().st_size < 0.3 * float_path.stat().st_size
    wav, rate = sf.read(Path(__file__).resolve().parents[1] / "examples" / "noisy.wav", dtype="float32")
    assert rate == 16000
    x = wav[None, : 5 * rate]
    outs = {}
    for name, backend in [
        ("float", OnnxStepper(float_path, model)),
        ("int8", OnnxStepper(int8_path, model)),
        ("by name", streaming_backend(model, "onnxruntime-int8")),
    ]:
        outs[name], _ = _stream(
            StreamingEnhancer(model, backend=backend), x, _sizes(256, np.random.default_rng(0))
        )
    ref = outs["float"]
    for name in ("int8", "by name"):  # by name: the one-frame int8 step runs these one-hop chunks
        snr = 10 * np.log10(np.sum(ref**2) / np.sum((outs[name] - ref) ** 2))
        assert 38.0 < snr < 80.0, name  # 42.9 dB (session 29); per-tensor int8 weights gave about 33


def test_torchscript_int8_is_close_to_float_on_the_default_model_and_really_quantised() -> None:
    """``torchscript-int8``: the traced step with the pre-encoder's four products in int8 (and nothing else).
    On the example file, in one-hop chunks and in 1000-sample chunks (several frames per call), its output stays
    within 38 dB of the float traced step's (44 dB when written) and is not the float output."""
    from pathlib import Path

    import soundfile as sf

    from enhance.backends import streaming_backend
    from models.pretrained import load_pretrained

    model = load_pretrained("default").model
    float_step, int8_step = (streaming_backend(model, n) for n in ("torchscript", "torchscript-int8"))
    graph = int8_step.module.graph.str()
    assert graph.count("quantized::linear_dynamic") == len(model.pre_encoder.blocks) == 4
    assert "quantized::linear_dynamic" not in float_step.module.graph.str()
    wav, rate = sf.read(Path(__file__).resolve().parents[1] / "examples" / "noisy.wav", dtype="float32")
    x = wav[None, : 5 * rate]
    for chunk in (256, 1000):
        ref, _ = _stream(StreamingEnhancer(model, backend=float_step), x, _sizes(chunk, None))
        y, _ = _stream(StreamingEnhancer(model, backend=int8_step), x, _sizes(chunk, None))
        assert y.shape == ref.shape
        snr = 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2))
        assert 38.0 < snr < 70.0, (chunk, snr)


def test_torchscript_int8_says_so_where_pytorch_has_no_int8_product(monkeypatch) -> None:
    """A PyTorch build without int8 kernels for the CPU cannot be had here, so its error is simulated: the backend
    raises Int8Unavailable (a RuntimeError, which the CLI reports with exit 2) naming the float backend."""
    from enhance.backends import streaming_backend
    from enhance.torch_int8 import Int8Unavailable

    def no_kernels(*args, **kwargs):
        raise RuntimeError("Didn't find engine for operation quantized::linear_prepack NoQEngine")

    monkeypatch.setattr(torch.ops.quantized, "linear_prepack", no_kernels)
    with pytest.raises(Int8Unavailable, match=r"cannot run int8 products here .*use the torchscript backend"):
        streaming_backend(_model("tiny").float(), "torchscript-int8")


@pytest.mark.parametrize("name", TINY)
def test_torchscript_backend_equals_pytorch(name: str) -> None:
    from enhance.fixed_step import TracedStepper

    torch.manual_seed(0)
    model = Enhancer(dataclasses.replace(_config(name), max_attenuation_db=12.0)).eval()
    backend = TracedStepper(model)
    assert not model.training
    x = (np.random.default_rng(7).standard_normal((2, 3100)) * 0.1).astype(np.float32)
    ref = enhance_waveform(model, x, return_competition=True)
    engine = StreamingEnhancer(model, 2, with_competition=True, backend=backend)
    y, _ = _stream(engine, x, _sizes(401, np.random.default_rng(1)))
    assert np.abs(y - ref.wav).max() < 1e-5
    if ref.competition:
        assert np.abs(engine.competition()[0] - ref.competition[0]).max() < 1e-5


def test_traced_backend_refuses_a_changed_attenuation_limit() -> None:
    """The traced step holds the limit it was built with: a later set_max_attenuation silently did not apply."""
    from enhance.fixed_step import TracedStepper

    model = _model("tiny")
    backend = TracedStepper(model)
    x = (np.random.default_rng(2).standard_normal((1, 1000)) * 0.1).astype(np.float32)
    StreamingEnhancer(model, backend=backend).process(x)
    model.set_max_attenuation(6.0)
    with pytest.raises(ValueError, match=r"built with the model's attenuation limit \(none\).*now 6 dB"):
        StreamingEnhancer(model, backend=backend).process(x)
    fresh = StreamingEnhancer(model, backend=TracedStepper(model))
    y = np.concatenate([fresh.process(x), fresh.flush()], axis=1)
    assert np.abs(y - enhance_waveform(model, x).wav).max() < 1e-5


def test_an_exported_step_is_refused_beside_another_limit_or_other_weights(tmp_path) -> None:
    """A step file records the limit and the weights it was exported from: wrapped around a model whose limit
    was changed since, or with other weights, it gave other samples, silently (found by a review)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    import onnx

    from enhance.onnx_backend import ORIGIN_KEYS, OnnxStepper, export_step

    model = _model("tiny")
    path = export_step(model, tmp_path / "step.onnx")
    int8 = export_step(model, tmp_path / "int8.onnx", int8=True)  # the quantiser keeps the record
    OnnxStepper(path, model)
    OnnxStepper(int8, model)
    model.set_max_attenuation(0.0)
    with pytest.raises(
        ValueError, match=r"exported with the attenuation limit none dB and the model's is 0\.0"
    ):
        OnnxStepper(path, model)
    model.set_max_attenuation(None)
    other = _model("tiny")
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    with pytest.raises(ValueError, match="exported from other weights"):
        OnnxStepper(path, other)
    proto = onnx.load(str(path))  # a file with no record (made by hand, or an older export)
    kept = [p for p in proto.metadata_props if p.key not in ORIGIN_KEYS]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    onnx.save(proto, str(tmp_path / "bare.onnx"))
    with pytest.raises(ValueError, match="does not say which weights"):
        OnnxStepper(tmp_path / "bare.onnx", model)


@pytest.mark.parametrize("backend", ["torchscript", "torchscript-int8", "native", "onnxruntime"])
def test_backends_refuse_to_run_after_new_weights_were_loaded(backend: str) -> None:
    """The traced, exported and C backends copy the weights when built: after load_state_dict they went on with
    the old ones (the stream differed from offline by 0.5), silently."""
    from enhance.backends import streaming_backend

    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model = _model("tiny").float()  # the fixed-step and C backends run float32
    stepper = streaming_backend(model, backend)
    x = (np.random.default_rng(3).standard_normal((1, 2000)) * 0.1).astype(np.float32)
    StreamingEnhancer(model, backend=stepper).process(x)
    model.load_state_dict(_model("tiny", seed=5).float().state_dict())
    with pytest.raises(ValueError, match=r"weights were loaded anew \(load_state_dict\)"):
        StreamingEnhancer(model, backend=stepper).process(x)
    fresh = StreamingEnhancer(model, backend=streaming_backend(model, backend))
    y = np.concatenate([fresh.process(x), fresh.flush()], axis=1)
    ref = enhance_waveform(model, x).wav
    if backend.endswith("int8"):  # int8 weights: close to the new weights' output, not equal
        assert 10 * np.log10(np.sum(ref**2) / np.sum((y - ref) ** 2)) > 25.0
    else:
        assert np.abs(y - ref).max() < 1e-5


def test_a_model_in_training_mode_is_enhanced_as_in_eval_and_left_in_its_mode() -> None:
    """A new Enhancer is in training mode: enhance_waveform gave other samples on every call (dropout), and
    StreamingEnhancer switched the caller's model to eval for good (dropout off in its training loop)."""
    model = _model("tiny").train()
    x = (np.random.default_rng(4).standard_normal((1, 4000)) * 0.1).astype(np.float32)
    first, second = enhance_waveform(model, x).wav, enhance_waveform(model, x).wav
    assert np.array_equal(first, second) and model.training
    engine = StreamingEnhancer(model)
    y = np.concatenate([engine.process(x), engine.flush()], axis=1)
    assert model.training and np.abs(y - first).max() < 1e-5
    model.eval()
    assert np.array_equal(enhance_waveform(model, x).wav, first)


def test_threads_sharing_a_model_in_training_mode_all_get_the_eval_output() -> None:
    """Each call switched the model to eval and back on its own: the first thread to finish turned dropout back
    on under the others (0.13-0.16 off in three runs of this test on the old code)."""
    import threading

    model = _model("tiny").train()
    x = (np.random.default_rng(5).standard_normal((1, 16000)) * 0.1).astype(np.float32)
    with torch.no_grad():
        ref = enhance_waveform(model, x).wav
    worst: list[float] = []

    def work() -> None:
        for _ in range(6):
            worst.append(float(np.abs(enhance_waveform(model, x).wav - ref).max()))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(worst) == 18 and max(worst) < 1e-5, max(worst)
    assert model.training  # and left as it was


def test_a_backend_made_for_another_model_is_refused() -> None:
    """The engine ran the backend's weights, silently: another model's output."""
    from enhance.backends import streaming_backend

    a, b = _model("tiny"), _model("tiny")
    with pytest.raises(ValueError, match="another model"):
        StreamingEnhancer(b, backend=streaming_backend(a, "torchscript"))
    StreamingEnhancer(a, backend=streaming_backend(a, "torchscript"))  # its own: fine


@pytest.mark.parametrize("backend", ["torchscript", "onnxruntime"])
@pytest.mark.parametrize("mae", [False, True])
@pytest.mark.parametrize("context", [4, 100])
def test_fixed_step_backends_run_many_frames_per_call(mae: bool, context: int, backend: str) -> None:
    """Large chunks go through the traced or exported step up to 64 frames at a time (at most ``context`` frames,
    so the new frames fit in the ring's oldest slots); the masks keep every frame's view to its own context."""
    from enhance.backends import streaming_backend
    from models.mae import MAEConfig
    from models.registry import with_mae

    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    cfg = tiny_config(2, context_frames=context)
    torch.manual_seed(0)
    model = Enhancer(with_mae(cfg, MAEConfig(hidden=8)) if mae else cfg).eval()
    x = (np.random.default_rng(2).standard_normal((1, 48000)) * 0.1).astype(np.float32)  # 188 frames
    ref = enhance_waveform(model, x, return_competition=True)
    engine = StreamingEnhancer(model, 1, with_competition=True, backend=streaming_backend(model, backend))
    calls, step_frames = [], []
    backend_step, backend_run = engine.backend.step, engine.backend.run

    def counting_step(feats, *args, **kwargs):  # records how many frames each engine call brought
        calls.append(feats.shape[1])
        return backend_step(feats, *args, **kwargs)

    def counting_run(feed):  # and how many went through each call of the step itself
        step_frames.append(feed["feat"].shape[1])
        return backend_run(feed)

    engine.backend.step, engine.backend.run = counting_step, counting_run
    y, _ = _stream(engine, x, [20000, 256, 27744])
    assert max(calls) >= 78  # 20000 samples: 78 frames in one engine call (64 + 14 through the step)
    assert max(step_frames) == min(64, context)
    assert np.abs(y - ref.wav).max() < 1e-5
    assert ref.competition is not None
    assert np.abs(engine.competition()[0] - ref.competition[0]).max() < 1e-5


@pytest.mark.parametrize("backend", ["torchscript", "onnxruntime"])
def test_fixed_step_backends_signal_path_equals_offline_through_silence(backend: str) -> None:
    """The fixed-step backends do the engine's analysis, synthesis and overlap-add in NumPy (run_frames): exact
    zeros first (zero spectra, whose phase is defined as 0; the untrained model puts energy there, so that rule
    decides those samples), two channels, chunks of 1 ... 1000 samples and a length that is not whole hops."""
    from enhance.backends import streaming_backend

    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    model = _model("tiny").float()
    stepper = streaming_backend(model, backend)
    x = np.zeros((2, 5001), np.float32)
    x[:, 2000:] = np.random.default_rng(8).standard_normal((2, 3001)) * 0.1
    ref = enhance_waveform(model, x, return_competition=True)
    assert np.abs(ref.wav[:, :1500]).max() > 1e-2
    for chunk in (1, 7, 256, 1000, "random"):
        engine = StreamingEnhancer(model, 2, with_competition=True, backend=stepper)
        assert engine._run_frames is not None  # the NumPy path, not the engine's PyTorch one
        y, _ = _stream(engine, x, _sizes(chunk, np.random.default_rng(3)))
        assert y.shape == x.shape and np.abs(y - ref.wav).max() < 1e-5, chunk
        assert ref.competition is not None
        assert np.abs(engine.competition()[0] - ref.competition[0]).max() < 1e-5


def test_fixed_step_backends_refuse_a_zero_context() -> None:
    from enhance.fixed_step import TracedStepper

    model = Enhancer(tiny_config(2, context_frames=0)).eval()
    with pytest.raises(ValueError, match="context_frames >= 1"):
        TracedStepper(model)


def _without_lookahead(cfg):
    return dataclasses.replace(cfg, pre_encoder=dataclasses.replace(cfg.pre_encoder, lookahead_frames=0))


def test_backend_choice() -> None:
    from enhance.backends import resolve_backend, streaming_backend
    from enhance.fixed_step import TracedStepper
    from enhance.native_backend import NativeStepper

    model = _model("tiny").float()
    assert (
        resolve_backend(model, "auto") == "native"
    )  # a C compiler is here (tests/test_native.py: without one)
    assert isinstance(streaming_backend(model, "auto"), NativeStepper)
    assert isinstance(streaming_backend(model, "torchscript"), TracedStepper)
    assert streaming_backend(model, "pytorch") is None
    assert resolve_backend(model.double(), "auto") == "pytorch"  # the fixed step is float32
    unbounded = Enhancer(tiny_config(2, context_frames=0)).eval()
    no_lookahead = Enhancer(_without_lookahead(tiny_config(2))).eval()
    for model_ in (
        unbounded,
        no_lookahead,
    ):  # the fixed step is written for these: auto falls back to PyTorch
        assert resolve_backend(model_, "auto") == "pytorch"
        with pytest.raises(ValueError, match="use the pytorch backend: --stream-backend pytorch"):
            streaming_backend(model_, "torchscript")
    with pytest.raises(ValueError, match="unknown streaming backend"):
        resolve_backend(model, "tensorrt")


@pytest.mark.parametrize("kind", ["torchscript", "torchscript-int8", "native", "onnxruntime"])
def test_one_backend_serves_concurrent_streams(kind: str) -> None:
    """The server shares one backend among its streams, each in its own thread: no state may leak between them."""
    from concurrent.futures import ThreadPoolExecutor

    from enhance.backends import streaming_backend
    from enhance.threads import inherit_threads

    model = _model("tiny").float()
    backend = streaming_backend(model, kind)
    rng = np.random.default_rng(3)
    inputs = [(rng.standard_normal((1, 4000)) * 0.1).astype(np.float32) for _ in range(4)]

    def run(x: np.ndarray) -> np.ndarray:
        inherit_threads()  # as the server's worker threads do: without it a worker rounds differently (2e-7)
        engine = StreamingEnhancer(model, 1, backend=backend)
        return _stream(engine, x, [256] * 16)[0]

    alone = [run(x) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(run, inputs))
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)
    assert not np.allclose(alone[0], alone[1])  # different inputs, different outputs: the check can fail


def test_onnx_backend_refuses_a_step_exported_by_an_older_version(tmp_path) -> None:
    """Steps exported before the multi-frame export took one frame and a boolean mask: a clear error, not an
    onnxruntime shape error in the middle of a stream."""
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from enhance.onnx_backend import OnnxStepper

    model = _model("tiny")
    feat = helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 1, 257])
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 2])
    out = helper.make_tensor_value_info("log_mag", TensorProto.FLOAT, [1, 1, 257])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["feat"], ["log_mag"])], "old", [feat, mask], [out]
    )
    path = tmp_path / "old.onnx"
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(old, str(path))
    with pytest.raises(ValueError, match="export it again"):
        OnnxStepper(path, model)


def test_onnx_backend_refuses_steps_with_the_wrong_frame_count(tmp_path) -> None:
    """The main step needs a free number of frames, the one-frame step exactly one: each mix-up is a clear error."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from enhance.onnx_backend import OnnxStepper, export_step

    model = _model("tiny")
    free = export_step(model, tmp_path / "free.onnx")
    two = export_step(model, tmp_path / "two.onnx", frames=2)
    with pytest.raises(ValueError, match="fixed number of frames"):
        OnnxStepper(two, model)
    for wrong in (free, two):
        with pytest.raises(ValueError, match="exactly 1 frame"):
            OnnxStepper(free, model, one_frame=wrong)


@pytest.mark.parametrize("backend", ["torchscript", "onnxruntime", "session-48k"])
def test_memory_stays_level_over_fifteen_minutes(backend: str) -> None:
    """The fixed-step backends (TorchScript, onnxruntime): every array and tensor reachable from the engine adds
    up to the same bytes after 5, 10 and 15 minutes of audio (tests/test_native.py runs the C engine for two
    hours). The server's stream Session at 48 kHz (resamplers, the band above 8 kHz; on the C step): the same
    within 4 KiB, since what its buffers hold between calls moves with the resampler's output lengths (measured:
    within 1.6 KiB, up and down, over 30 minutes); a leak of 14 bytes per 10-s chunk would exceed it."""
    from enhance.backends import streaming_backend
    from tests.conftest import reachable_array_bytes

    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    model = _model("tiny").float()
    rate = 48000 if backend == "session-48k" else 16000
    engine = StreamingEnhancer(
        model, 1, backend=streaming_backend(model, "auto" if rate == 48000 else backend)
    )
    target: object = engine
    process = engine.process
    if backend == "session-48k":
        from server.schemas import StreamStart
        from server.stream import Session

        session = Session(engine, StreamStart(sample_rate=rate))
        target, process = session, session.process
    rng = np.random.default_rng(9)
    # 10 s, 1 sample less and 1 more: the hop (and resampler) phase moves between chunks, and is the same again
    # after each three
    chunks = [(rng.standard_normal((1, 10 * rate + d)) * 0.1).astype(np.float32) for d in (0, -1, 1)]
    totals = []
    for _ in range(3):
        for i in range(30):  # 5 minutes
            y = process(chunks[i % 3])
            assert np.isfinite(y).all() and y.shape[1] > 0
        totals.append(reachable_array_bytes(target))
    assert max(totals) - min(totals) <= (4096 if backend == "session-48k" else 0), totals
    assert totals[0] > 4 * sum(p.numel() for p in model.parameters())  # the walk reached the weights


@pytest.mark.parametrize("rate", [48000, 44100, 96000, 8000])
def test_streaming_at_another_rate_through_the_rate_bridge_equals_offline(rate: int) -> None:
    """The README's loop for a sound card's rate: RateStream.process per chunk, then finish, gives enhance_audio's
    samples at the input's length, for lengths that are not whole seconds (the README's loop over a bare
    RateBridge, tested on exactly 1 s, ended a sample or two off at 44.1-96 kHz); resampling_ms says how much
    the resamplers hold back beyond the engine."""
    from enhance.offline import enhance_audio
    from enhance.rate_bridge import resampling_ms
    from enhance.rate_stream import RateStream

    model = _model("tiny").float()
    for n in (rate, rate + 1, 24001):
        x = (np.random.default_rng(8).standard_normal((2, n)) * 0.1).astype(np.float32)
        stream = RateStream(StreamingEnhancer(model, channels=2), rate)
        out = [stream.process(x[:, i : i + 480]) for i in range(0, n, 480)]
        out.append(stream.finish())
        y = np.concatenate(out, axis=1)
        ref = enhance_audio(model, x, rate).wav
        assert y.shape == ref.shape == x.shape, (n, y.shape)
        assert np.abs(y - ref).max() < 1e-5, n
    assert 0 < resampling_ms(rate) < 250 and resampling_ms(16000) == 0


def test_a_stream_at_12_khz_holds_back_no_more_than_ready_says() -> None:
    """resampling_ms (the WebSocket's ready.resampling_ms) is a bound on what a stream holds back: from a 5-s dry
    run it said 97 ms at 12 kHz, where a stream of 10-ms frames held 151 beyond the engine's delay after 11 s
    (soxr's bursts beat with the engine's hops over a long period)."""
    from enhance.rate_bridge import resampling_ms
    from enhance.rate_stream import RateStream

    rate, step = 12000, 120
    engine = StreamingEnhancer(_model("tiny").float())
    stream = RateStream(engine, rate)
    bound = (
        engine.latency_ms + resampling_ms(rate, "HQ", engine.latency_samples, engine.cfg.hop_length)
    ) / 1000
    frame = (0.1 * np.random.default_rng(3).standard_normal((1, step))).astype(np.float32)
    held = []
    for _ in range(1500):  # 15 s
        stream.process(frame)
        held.append(stream.received - stream.sent)
    assert max(held) / rate <= bound + 1e-9, (max(held) / rate, bound)
    assert max(held) / rate > bound - 0.02  # the bound is close: the stream reaches it within 20 ms


@pytest.mark.parametrize("rate", [48000, 16000])
def test_the_rate_bridge_refuses_what_the_engine_refuses_before_taking_it_in(rate: int) -> None:
    """Through the bridge, int16 PCM was taken as floats 32768 times too loud (no error), and a NaN chunk went
    into the resampler unchecked: the engine then refused the next, valid chunks, which carried its samples."""
    from enhance.rate_stream import RateStream

    model = _model("tiny").float()
    x = (0.1 * np.random.default_rng(5).standard_normal((1, rate))).astype(np.float32)
    step = rate // 100
    whole = RateStream(StreamingEnhancer(model), rate)
    ref = np.concatenate(
        [whole.process(x[:, i : i + step]) for i in range(0, rate, step)] + [whole.finish()], 1
    )
    stream = RateStream(StreamingEnhancer(model), rate)
    out = []
    for i in range(0, rate, step):
        if i == rate // 2:
            for bad, says in (
                ((x[:, i : i + step] * 32768).astype(np.int16), "integer PCM: divide by 32768"),
                (np.full((1, step), np.nan, np.float32), f"chunk: {step} sample(s) are NaN or infinite"),
                (np.full((1, step), 2000.0, np.float32), "beyond ±1000"),
                (x[:, i : i + step].T.copy(), "pass chunk.T"),
            ):
                with pytest.raises(ValueError, match=re.escape(says)):
                    stream.process(bad)
        out.append(
            stream.process(x[:, i : i + step])
        )  # every valid chunk is taken, as if none had been refused
    y = np.concatenate([*out, stream.finish()], axis=1)
    assert y.shape == ref.shape and np.array_equal(y, ref)
