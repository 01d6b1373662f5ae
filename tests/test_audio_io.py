from __future__ import annotations

import io
import stat
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from enhance.audio_io import AudioError, load_audio, read_info, resample, save_audio
from enhance.offline import enhance_audio, enhance_waveform
from models import Enhancer, get_config
from tests.conftest import flac_without_length, speech_like


@pytest.fixture(scope="module")
def tiny() -> Enhancer:
    torch.manual_seed(0)
    return Enhancer(get_config("tiny")).eval()


@pytest.mark.parametrize(
    "subtype,fmt,suffix", [("PCM_16", "WAV", ".wav"), ("PCM_24", "FLAC", ".flac"), ("FLOAT", "WAV", ".wav")]
)
def test_load_save_keeps_rate_channels_and_samples(
    tmp_path: Path, subtype: str, fmt: str, suffix: str
) -> None:
    wav = np.stack([speech_like(0.5, 22050, seed=1), speech_like(0.5, 22050, seed=2)])
    path = tmp_path / f"a{suffix}"
    save_audio(path, wav, 22050, subtype=subtype)
    back, info = load_audio(path)
    assert (info.sample_rate, info.channels, info.frames, info.format, info.subtype) == (
        22050,
        2,
        wav.shape[1],
        fmt,
        subtype,
    )
    assert np.abs(back - wav).max() < 1e-4
    assert stat.S_IMODE(path.stat().st_mode) & 0o044  # readable by others like a normally created file


# steps of the subtype: below half a step, above it, negative ones, beyond full scale
STEPS = np.array([0.7, 0.3, -0.3, -0.7, 2.2, -2.6, 1e9, -1e9])


@pytest.mark.parametrize(
    "fmt,subtype,bits",
    [("WAV", "PCM_16", 16), ("WAV", None, 16), ("AIFF", "PCM_16", 16), ("FLAC", "PCM_16", 16),
     ("WAV", "PCM_24", 24), ("FLAC", "PCM_24", 24), ("WAV", "PCM_32", 32), ("WAV", "PCM_U8", 8),
     ("AIFF", "PCM_S8", 8)],
)  # fmt: skip
def test_integer_outputs_are_rounded_to_the_nearest_step(
    tmp_path: Path, fmt: str, subtype: str | None, bits: int
) -> None:
    """libsndfile 1.2.2 turns float into 16- and 24-bit WAV and AIFF by rounding down (0.7 of a step became 0 and
    -0.3 became -1), FLAC by rounding: every writer here now rounds, as the raw pipe and the WebSocket stream do."""
    full = 2.0 ** (bits - 1)
    x = np.clip(STEPS / full, -1e3, 1e3).astype(np.float32)[None]
    expected = np.clip(np.round(STEPS), -full, full - 1)
    path = tmp_path / f"a.{fmt.lower()}"
    save_audio(path, x, 16000, format=fmt, subtype=subtype)
    back, _ = sf.read(path, dtype="float64")
    assert np.array_equal(np.round(back * full), expected), back * full


def test_codecs_read_only_sequentially_are_loaded(tmp_path: Path) -> None:
    x = speech_like(0.5, 8000, seed=3)
    for fmt, subtype in (("WAV", "GSM610"), ("WAV", "G721_32"), ("WAV", "NMS_ADPCM_16"), ("AU", "G723_24")):
        path = tmp_path / f"a_{subtype}.{fmt.lower()}"
        sf.write(path, x, 8000, format=fmt, subtype=subtype)
        wav, info = load_audio(path)
        assert info.subtype == subtype and wav.shape == (1, sf.info(str(path)).frames)
        n = min(len(x), wav.shape[1])
        assert np.corrcoef(wav[0, :n], x[:n])[0, 1] > 0.8, subtype  # lossy, but the same signal


def test_a_dwvw_aiff_is_read_in_order(tmp_path: Path) -> None:
    """libsndfile calls a DWVW-coded AIFF seekable, but its seeks fail, and soundfile seeks around each read: it
    was "no audio decodes ... (corrupt?)", from a file, a pipe or an upload, though enhance-cli writes such
    files itself (--subtype DWVW_16)."""
    x = speech_like(0.5, 16000, seed=4)
    path = tmp_path / "a.aiff"
    sf.write(path, x, 16000, subtype="DWVW_16")
    for source in (path, path.read_bytes()):
        wav, info = load_audio(source)
        assert info.subtype == "DWVW_16" and wav.shape == (1, len(x))
        assert np.abs(wav[0] - x).max() < 1e-4  # 16-bit steps: lossless
        assert read_info(source).frames == len(x)


def test_chained_ogg_streams_are_counted(tmp_path: Path) -> None:
    """libsndfile reads the first stream of a chained Ogg file only (`cat a.ogg b.ogg`): the rest was dropped
    without a word. The count finds the chain in a file or in memory, and a plain file is 1."""
    from enhance.audio_io import ogg_chain_length

    x = speech_like(0.5, 16000, seed=5)
    for subtype, suffix in (("VORBIS", "ogg"), ("OPUS", "opus")):
        one = tmp_path / f"one.{suffix}"
        sf.write(one, x, 16000, format="OGG", subtype=subtype)
        chain = tmp_path / f"chain.{suffix}"
        chain.write_bytes(one.read_bytes() * 3)
        assert ogg_chain_length(one) == 1 and ogg_chain_length(chain) == 3
        assert ogg_chain_length(io.BytesIO(chain.read_bytes())) == 3
    (tmp_path / "empty.ogg").write_bytes(b"")
    assert ogg_chain_length(tmp_path / "empty.ogg") == 1


def test_a_flac_without_length_and_too_many_channels_say_so(tmp_path: Path) -> None:
    """libsndfile reports 2**63 - 1 frames for a FLAC whose header has no length, and fails at the first read;
    65 channels was "not a readable audio file (... 65 channels ...)" from the catch-all around the read."""
    (tmp_path / "piped.flac").write_bytes(flac_without_length())
    assert sf.info(str(tmp_path / "piped.flac")).frames == 2**63 - 1
    for read in (load_audio, read_info):
        with pytest.raises(AudioError, match="its header gives no length"):
            read(tmp_path / "piped.flac")
    sf.write(tmp_path / "many.wav", np.full((10, 65), 0.1, np.float32), 16000)
    with pytest.raises(AudioError, match=r"many.wav: 65 channels \(at most 64 are enhanced\)$"):
        load_audio(tmp_path / "many.wav")


def test_an_output_written_meanwhile_by_another_process_is_kept(tmp_path: Path) -> None:
    """Two runs that both found the output free: the second's rename replaced the first's file even without
    --overwrite. Without replace, the name taken meanwhile stays as it is, and nothing else is left."""
    from enhance.atomic_files import atomic_path

    target = tmp_path / "out.wav"
    with (
        pytest.raises(FileExistsError, match="written meanwhile by another process"),
        atomic_path(target, replace=False) as tmp,
    ):
        Path(tmp).write_bytes(b"mine")
        target.write_bytes(b"theirs")  # the other run finished first
    assert target.read_bytes() == b"theirs" and [p.name for p in tmp_path.iterdir()] == ["out.wav"]
    with atomic_path(tmp_path / "new.wav", replace=False) as tmp:
        Path(tmp).write_bytes(b"mine")
    assert (tmp_path / "new.wav").read_bytes() == b"mine" and len(list(tmp_path.iterdir())) == 2
    with atomic_path(target) as tmp:  # replace (--overwrite): as before
        Path(tmp).write_bytes(b"mine")
    assert target.read_bytes() == b"mine"
    with atomic_path(tmp_path / "sub" / "state.pt", durable=True) as tmp:  # fsynced file and folder
        Path(tmp).write_bytes(b"state")
    assert (tmp_path / "sub" / "state.pt").read_bytes() == b"state" and len(list(tmp_path.iterdir())) == 3


def test_bad_inputs_have_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="no such file"):
        load_audio(tmp_path / "missing.wav")
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match="empty file"):
        load_audio(tmp_path / "empty.wav")
    (tmp_path / "junk.wav").write_bytes(b"RIFF....garbage" * 10)
    with pytest.raises(AudioError, match="not a readable audio file"):
        load_audio(tmp_path / "junk.wav")
    sf.write(tmp_path / "zero.wav", np.zeros((0, 1), np.float32), 16000)
    with pytest.raises(AudioError, match="no samples"):
        load_audio(tmp_path / "zero.wav")
    nan = speech_like(0.1)
    nan[10] = np.nan
    sf.write(tmp_path / "nan.wav", nan, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        load_audio(tmp_path / "nan.wav")
    with pytest.raises(AudioError, match="cannot write"):
        save_audio(tmp_path / "out.xyz", nan[None], 16000)
    assert not (tmp_path / "out.xyz").exists()


def test_resample_round_trip_is_close() -> None:
    x = speech_like(1.0, 16000)[None]
    y = resample(resample(x, 16000, 44100), 44100, 16000)
    n = min(x.shape[1], y.shape[1])
    err = np.abs(x[:, 100 : n - 100] - y[:, 100 : n - 100]).max()
    assert err < 1e-2 * np.abs(x).max()


@pytest.mark.parametrize("n", [1, 2, 255, 257, 4001, 16001])
def test_enhancer_keeps_length(tiny: Enhancer, n: int) -> None:
    out = enhance_waveform(tiny, np.random.default_rng(0).standard_normal((2, n)).astype(np.float32) * 0.1)
    assert out.wav.shape == (2, n)
    assert np.isfinite(out.wav).all()


def test_enhancer_refuses_empty_and_nan(tiny: Enhancer) -> None:
    with pytest.raises(AudioError, match="no samples"):
        enhance_waveform(tiny, np.zeros((1, 0), np.float32))
    bad = np.zeros((1, 100), np.float32)
    bad[0, 5] = np.inf
    with pytest.raises(AudioError, match="NaN or infinite"):
        enhance_waveform(tiny, bad)


def test_enhancer_refuses_integer_pcm_and_samples_by_channels(tiny: Enhancer) -> None:
    """The two mistakes a library user makes with soundfile's arrays: they were taken silently (int16 values as
    32768 times too loud, a model that depends on level; [samples, channels] as thousands of 2-sample channels,
    minutes and gigabytes later)."""
    x = speech_like(0.5)[None].repeat(2, 0)
    with pytest.raises(AudioError, match=r"dtype int16 \(integer PCM: divide by 32768\)"):
        enhance_waveform(tiny, (x * 32767).astype(np.int16))
    with pytest.raises(AudioError, match=r"pass wav.T"):
        enhance_audio(tiny, np.ascontiguousarray(x.T), 16000)
    # torch tensors and lists are taken as arrays; one sample at 44.1 kHz (none at 16 kHz) comes back as one
    assert enhance_waveform(tiny, torch.from_numpy(x)).wav.shape == x.shape
    assert enhance_audio(tiny, x[:, :1].tolist(), 44100).wav.shape == (2, 1)


def test_channels_are_enhanced_independently(tiny: Enhancer) -> None:
    a, b = speech_like(0.4, seed=1), speech_like(0.4, seed=2)
    both = enhance_waveform(tiny, np.stack([a, b])).wav
    alone = enhance_waveform(tiny, a[None]).wav
    assert np.allclose(both[0], alone[0], atol=1e-5)


def test_a_whole_float_rate_and_float16_audio_are_taken_at_any_rate(tiny: Enhancer) -> None:
    """44100.0 crashed the high band's indexing (IndexError), float16 audio soxr's resampler (TypeError); a rate
    that is not a whole number of Hz is a clear error."""
    x = speech_like(0.5, 44100, seed=6)[None]
    ref = enhance_audio(tiny, x, 44100).wav
    assert np.array_equal(enhance_audio(tiny, x, 44100.0).wav, ref)
    half = x.astype(np.float16)
    out = enhance_audio(tiny, half, 44100).wav
    assert out.dtype == np.float32 and np.array_equal(
        out, enhance_audio(tiny, half.astype(np.float32), 44100).wav
    )
    for bad in (44100.5, "44100", True):  # a str was a TypeError from comparing it with 1
        with pytest.raises(ValueError, match="whole number of Hz"):
            enhance_audio(tiny, x, bad)  # type: ignore[arg-type]
    for out_of_range in (999, 1_000_000):  # the CLI and the server refused them; Python took them
        with pytest.raises(ValueError, match=f"sample rate {out_of_range} Hz is outside the 1000-768000 Hz"):
            enhance_audio(tiny, x, out_of_range)


def test_any_rate_comes_back_at_its_rate_and_length(tiny: Enhancer) -> None:
    x = speech_like(0.7, 44100)[None]
    out = enhance_audio(tiny, x, 44100, return_competition=True)
    assert out.wav.shape == x.shape
    assert out.competition is not None and out.competition[0].shape[-1] == 2


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile has no MP3")
def test_mp3_in_memory_reads_whatever_lies_in_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    """libsndfile sniffs MP3 in memory poorly and then looks for an SD2 resource fork named "._" + the file's
    name; memory has no name, so a stray "._" file in the working folder made every MP3 upload to the server
    fail ("bad data offset"). Such bytes now open from a temporary .mp3 file."""
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    sf.write(buf, (0.1 * rng.standard_normal(8000)).astype(np.float32), 16000, format="MP3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "._").write_bytes(b"")
    with pytest.raises(sf.LibsndfileError):  # what the test is about
        sf.info(io.BytesIO(buf.getvalue()))
    info = read_info(buf.getvalue())
    assert (info.format, info.frames, info.sample_rate) == ("MP3", 8000, 16000)
    wav, _ = load_audio(buf.getvalue())
    assert wav.shape == (1, 8000) and np.abs(wav).max() > 0.01
    assert list(tmp_path.iterdir()) == [tmp_path / "._"]  # no temporary file left behind
