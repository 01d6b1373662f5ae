"""enhance-cli run as a subprocess on generated files of every kind: rates, channels, subtypes, lengths, bad files."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from enhance.audio_io import load_audio
from enhance.offline import enhance_audio
from models import Enhancer, get_config, load_checkpoint, save_checkpoint
from models.pretrained import load_pretrained, pretrained_path
from tests.conftest import ROOT, speech_like

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ck") / "tiny.safetensors"
    save_checkpoint(path, Enhancer(get_config("tiny")), "tiny")
    return str(path)


def cli(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args],
        input=stdin,
        capture_output=True,
        env=ENV,
        cwd=cwd,
        timeout=300,
    )


def noisy(seconds: float, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sig = np.stack([speech_like(seconds, rate, seed=seed + c) for c in range(channels)], axis=1)
    return (sig + 0.02 * rng.standard_normal(sig.shape)).astype(np.float32)


@pytest.mark.parametrize(
    "rate,channels,suffix,subtype",
    [
        (16000, 1, ".wav", "PCM_16"),
        (8000, 1, ".wav", "PCM_U8"),
        (22050, 2, ".flac", "PCM_24"),
        (44100, 3, ".wav", "FLOAT"),
        (48000, 2, ".wav", "PCM_32"),
        (32000, 1, ".ogg", "VORBIS"),
        (24000, 1, ".aiff", "PCM_16"),
    ],
)
def test_output_keeps_rate_channels_subtype_and_length(
    tmp_path: Path, ckpt: str, rate: int, channels: int, suffix: str, subtype: str
) -> None:
    src = tmp_path / f"in{suffix}"
    sf.write(src, noisy(1.3, rate, channels), rate, subtype=subtype)
    dst = tmp_path / f"out{suffix}"
    proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    a, b = sf.info(str(src)), sf.info(str(dst))
    assert (b.samplerate, b.channels, b.subtype, b.format) == (a.samplerate, a.channels, a.subtype, a.format)
    assert b.frames == a.frames
    out, _ = load_audio(dst)
    assert np.isfinite(out).all() and np.abs(out).max() > 0


def test_mp3_input_is_read(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "in.mp3"
    try:
        sf.write(src, noisy(1.0, 44100), 44100, format="MP3", subtype="MPEG_LAYER_III")
    except Exception:
        pytest.skip("this libsndfile cannot write MP3")
    proc = cli(str(src), "-o", str(tmp_path / "out.wav"), "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(tmp_path / "out.wav")).samplerate == 44100


def test_file_names_that_are_not_utf8_are_enhanced(tmp_path: Path, ckpt: str) -> None:
    """soundfile encodes str paths strictly: a name with bytes that are not UTF-8 failed ("'utf-8' codec can't
    encode character '\\udcff'"). Such files are enhanced, and their outputs keep the same bytes in the name."""
    folder = tmp_path / "in"
    folder.mkdir()
    name = b"take\xff 1.wav"
    sf.write(os.fsencode(folder) + b"/" + name, noisy(0.5, 16000), 16000)
    for extra in ([], ["--stream"]):
        out = tmp_path / f"out{len(extra)}"
        proc = cli(str(folder), "-o", f"{out}/", "--checkpoint", ckpt, *extra)
        assert proc.returncode == 0, proc.stderr.decode()
        assert os.listdir(os.fsencode(out)) == [name]
        assert sf.info(os.fsencode(out) + b"/" + name).frames == 8000


@pytest.mark.parametrize(("fmt", "subtype"), [("WAV", "GSM610"), ("AU", "G723_24")])
def test_codecs_read_only_sequentially_are_enhanced(
    tmp_path: Path, ckpt: str, fmt: str, subtype: str
) -> None:
    """GSM 6.10 and G.72x files are not seekable (libsndfile reads them front to back): both paths enhance them."""
    src = tmp_path / f"call.{fmt.lower()}"
    sf.write(src, noisy(1.0, 8000), 8000, format=fmt, subtype=subtype)
    with sf.SoundFile(src) as f:
        assert not f.seekable()
        frames = f.frames
    for flags in ([], ["--stream"]):
        dst = tmp_path / f"out{len(flags)}.{fmt.lower()}"
        proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, *flags)
        assert proc.returncode == 0, proc.stderr.decode()
        info = sf.info(str(dst))
        assert (info.subtype, info.samplerate, info.frames) == (subtype, 8000, frames)


@pytest.mark.parametrize("n", [1, 100, 257])
def test_very_short_inputs_keep_their_length(tmp_path: Path, ckpt: str, n: int) -> None:
    src = tmp_path / "short.wav"
    sf.write(src, noisy(1.0, 16000)[:n], 16000, subtype="FLOAT")
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(tmp_path / "o.wav")).frames == n


@pytest.mark.parametrize("mode", [[], ["--stream"]], ids=["offline", "stream"])
def test_digital_silence_is_enhanced_to_silence_with_a_warning(
    tmp_path: Path, ckpt: str, mode: list[str]
) -> None:
    """A muted take in a folder of recordings was a failed file and exit 1; the library always took it. Now it
    is enhanced like any audio and the user is told. The bundled model turns it into exact silence of the same
    shape (the untrained tiny model does not: what silence becomes is the model's, not a special case)."""
    src = tmp_path / "muted.wav"
    sf.write(src, np.zeros((44100, 2), np.float32), 44100, subtype="PCM_16")
    out = tmp_path / "o.wav"
    proc = cli(str(src), "-o", str(out), *mode)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"warning:" in proc.stderr and b"all samples are zero (digital silence)" in proc.stderr
    y, rate = sf.read(out, always_2d=True)
    assert rate == 44100 and y.shape == (44100, 2) and not y.any()


@pytest.mark.parametrize("rate", [16000, 44100])
def test_chunked_processing_equals_whole_file(tmp_path: Path, ckpt: str, rate: int) -> None:
    """Small chunks (many chunk boundaries) give the whole-file offline result."""
    x = noisy(7.0, rate, channels=2)
    src = tmp_path / "long.wav"
    sf.write(src, x, rate, subtype="FLOAT")
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--checkpoint", ckpt, "--chunk-seconds", "0.3")
    assert proc.returncode == 0, proc.stderr.decode()
    out, _ = load_audio(tmp_path / "o.wav")
    model = load_checkpoint(ckpt).model
    ref = enhance_audio(model, np.ascontiguousarray(x.T), rate).wav
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() < 1e-5


def test_high_band_gate_is_the_default_and_drop_leaves_it_out(tmp_path: Path, ckpt: str) -> None:
    """A 48 kHz file keeps its band above 8 kHz (gated, as enhance_audio, offline and --stream alike);
    --high-band drop leaves only the model's band; an unknown choice is a usage error."""
    rate = 48000
    x = noisy(1.5, rate)
    src = tmp_path / "in.wav"
    sf.write(src, x, rate, subtype="FLOAT")

    def above(y: np.ndarray, hz: float = 8500) -> float:
        spec = np.abs(np.fft.rfft(y[0].astype(np.float64))) ** 2
        return float(spec[np.fft.rfftfreq(y.shape[1], 1 / rate) > hz].sum())

    outs = {}
    for name, extra in (("gate", []), ("stream", ["--stream"]), ("drop", ["--high-band", "drop"])):
        dst = tmp_path / f"{name}.wav"
        proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, *extra)
        assert proc.returncode == 0, proc.stderr.decode()
        outs[name] = load_audio(dst)[0]
    ref = enhance_audio(load_checkpoint(ckpt).model, np.ascontiguousarray(x.T), rate).wav
    assert np.abs(outs["gate"] - ref).max() < 1e-5
    assert np.abs(outs["stream"] - ref).max() < 1e-5
    xin = np.ascontiguousarray(x.T)
    assert above(outs["drop"]) < 1e-3 * above(xin) and above(outs["gate"]) > 0.1 * above(xin)
    proc = cli(str(src), "-o", str(tmp_path / "bad.wav"), "--checkpoint", ckpt, "--high-band", "keep")
    assert proc.returncode == 2 and b"--high-band" in proc.stderr
    assert not (tmp_path / "bad.wav").exists()


def _bad_files(d: Path) -> dict[str, tuple[Path, str]]:
    d.mkdir(exist_ok=True)
    files: dict[str, tuple[Path, str]] = {}
    (d / "empty.wav").write_bytes(b"")
    files["empty"] = (d / "empty.wav", "empty file")
    (d / "junk.wav").write_bytes(b"RIFF" + os.urandom(300))
    files["corrupt"] = (d / "junk.wav", "not a readable audio file")
    (d / "notes.txt").write_text("hello, I am not audio\n")
    files["unsupported"] = (d / "notes.txt", "not a readable audio file")
    if "MP3" in sf.available_formats():  # libsndfile said "File does not exist or is not a regular file"
        buf = io.BytesIO()
        sf.write(buf, noisy(1.0, 16000), 16000, format="MP3")
        (d / "stub.mp3").write_bytes(buf.getvalue()[:300])
        files["cut to 300 bytes"] = (d / "stub.mp3", "no format libsndfile decodes: cut short or damaged?")
    sf.write(d / "zero_length.wav", np.zeros((0, 1), np.float32), 16000)
    files["zero-length"] = (d / "zero_length.wav", "no samples")
    x = noisy(1.0, 16000)
    x[500] = np.nan
    sf.write(d / "nan.wav", x, 16000, subtype="FLOAT")
    files["nan"] = (d / "nan.wav", "NaN or infinite")
    x[500] = np.inf
    sf.write(d / "inf.wav", x, 16000, subtype="FLOAT")
    files["inf"] = (d / "inf.wav", "NaN or infinite")
    x[500] = 3e38  # finite, but not audio: it came out as NaN samples
    sf.write(d / "huge.wav", x, 16000, subtype="FLOAT")
    files["huge"] = (d / "huge.wav", "beyond ±1000")
    late = noisy(12.0, 16000)
    late[11 * 16000] = np.nan  # in the second 10-s block: the first was already enhanced and written
    sf.write(d / "nan_late.wav", late, 16000, subtype="FLOAT")
    files["nan-late"] = (d / "nan_late.wav", "NaN or infinite")
    files["missing"] = (d / "missing.wav", "no such file")
    sf.write(d / "rate_500.wav", noisy(1.0, 500), 500)  # the server refuses it too (unsupported_sample_rate)
    files["500 Hz"] = (d / "rate_500.wav", "sample rate 500 Hz is outside the 1000-768000 Hz")
    return files


@pytest.mark.parametrize("mode", [[], ["--stream"]], ids=["offline", "stream"])
def test_bad_inputs_fail_alone_with_one_line_each(tmp_path: Path, ckpt: str, mode: list[str]) -> None:
    """Each bad file (NaN or huge samples mid-file included) fails alone, with its path and reason, offline and
    through the streaming engine, which reads in blocks and so meets a bad block after writing good ones."""
    bad = _bad_files(tmp_path / "in")
    good = tmp_path / "in" / "good.wav"
    sf.write(good, noisy(0.8, 16000), 16000)
    out = tmp_path / "out"
    paths = [str(p) for p, _ in bad.values()] + [str(good)]
    proc = cli(*paths, "-o", f"{out}/", "--checkpoint", ckpt, "--json", *mode)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.decode().splitlines() if line.startswith("enhance-cli: error:")]
    assert len(errors) == len(bad)
    for path, reason in bad.values():
        line = next((e for e in errors if str(path) in e), None)
        assert line is not None and reason in line, (path, reason, errors)
    # the good file was still enhanced; nothing else was written, not even temp files
    assert sorted(p.name for p in out.iterdir()) == ["good.wav"]
    summary = json.loads(proc.stdout)
    assert summary["ok"] == 1 and summary["failed"] == len(bad)


def test_never_overwrites_without_flag_and_never_the_input(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    dst = tmp_path / "b.wav"
    dst.write_bytes(b"precious")
    proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt)
    assert proc.returncode == 1 and b"output exists" in proc.stderr
    assert dst.read_bytes() == b"precious"
    assert cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "--overwrite").returncode == 0
    assert sf.info(str(dst)).frames == 8000
    before = src.read_bytes()
    proc = cli(
        str(src), "-o", str(src), "--checkpoint", ckpt, "--overwrite"
    )  # a usage error, before any work
    assert proc.returncode == 2 and b"refusing to overwrite the input" in proc.stderr
    assert src.read_bytes() == before


def test_default_output_name_folders_and_globs(tmp_path: Path, ckpt: str) -> None:
    d = tmp_path / "takes"
    (d / "sub").mkdir(parents=True)
    for name in ("one.wav", "two.flac", "sub/three.wav"):
        sf.write(d / name, noisy(0.4, 16000), 16000)
    assert cli(str(d / "one.wav"), "--checkpoint", ckpt).returncode == 0
    assert (d / "one.enhanced.wav").is_file()
    (d / "one.enhanced.wav").unlink()
    out = tmp_path / "out"
    assert cli(str(d), "-o", str(out), "--checkpoint", ckpt).returncode == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "one.wav",
        "sub/three.wav",
        "two.flac",
    ]
    out2 = tmp_path / "out2"
    assert cli(str(d / "*.wav"), "-o", f"{out2}/", "--checkpoint", ckpt).returncode == 0
    assert sorted(p.name for p in out2.iterdir()) == ["one.wav"]


def test_stdin_to_stdout(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.flac"
    sf.write(src, noisy(0.6, 22050, 2), 22050)
    proc = cli("-", "-o", "-", "--checkpoint", ckpt, stdin=src.read_bytes())
    assert proc.returncode == 0, proc.stderr.decode()
    (tmp_path / "o.wav").write_bytes(proc.stdout)
    info = sf.info(str(tmp_path / "o.wav"))
    assert (info.format, info.samplerate, info.channels, info.frames) == (
        "WAV",
        22050,
        2,
        sf.info(str(src)).frames,
    )
    bad = cli("-", "-o", "-", "--checkpoint", ckpt, stdin=b"")
    assert bad.returncode == 1 and b"<stdin>: empty input" in bad.stderr and bad.stdout == b""


def test_competition_map_npz_and_png(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.wav"
    sf.write(src, noisy(1.0, 16000), 16000)
    assert (
        cli(
            str(src),
            "-o",
            str(tmp_path / "o.wav"),
            "--checkpoint",
            ckpt,
            "--competition-map",
            str(tmp_path / "m.npz"),
        ).returncode
        == 0
    )
    data = np.load(tmp_path / "m.npz")
    assert list(data["blocks"]) == [2]
    maps = data["block2"]
    assert maps.shape == (1, 64, 2)  # 1 channel, ceil(16000/256)+1 frames, 2 mechanisms
    wav, _ = load_audio(str(src))
    ref = enhance_audio(load_checkpoint(ckpt).model, wav, 16000, return_competition=True).competition
    assert ref is not None
    assert np.abs(maps - ref[0]).max() < 1e-5  # the model's own maps, frame for frame
    assert data["frame_times"] == pytest.approx(np.arange(64) * 0.016)  # frame t centred at t x 16 ms
    png = tmp_path / "m.png"
    proc = cli(str(src), "-o", str(tmp_path / "o2.wav"), "--checkpoint", ckpt, "--competition-map", str(png))
    assert proc.returncode == 0, proc.stderr.decode()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_scan_follows_linked_folders_once_and_reports_dangling_links(
    tmp_path: Path, ckpt: str
) -> None:
    """A folder's scan (rglob) entered no linked folder and dropped a link whose target is gone, both silently.
    Now a linked folder is enhanced as part of the tree (once: a folder reached both ways keeps its own name,
    and a link to a folder above is no loop), and a dangling link fails with its reason (exit 1)."""
    outside, tree = tmp_path / "outside", tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    outside.mkdir()
    for f in (tree / "a.wav", tree / "sub" / "b.wav", outside / "c.wav"):
        sf.write(f, noisy(0.3, 16000), 16000)
    (tree / "external").symlink_to(outside)
    (tree / "again").symlink_to(tree / "sub")
    (tree / "sub" / "up").symlink_to(tree)
    (tree / ".meta").mkdir()  # a hidden folder is not entered: its link hid sub from the scan
    (tree / ".meta" / "first").symlink_to(tree / "sub")
    (tree / "gone.wav").symlink_to(tmp_path / "nowhere.wav")
    out = tmp_path / "out"
    out.mkdir()
    sf.write(out / "old.wav", noisy(0.3, 16000), 16000)  # an earlier run's output, linked into the tree
    (tree / "results").symlink_to(out)
    proc = cli(str(tree), "-o", str(out), "--checkpoint", ckpt, "--json", "-q")
    assert proc.returncode == 1, proc.stderr
    assert (
        f"{tree / 'gone.wav'}: a link to {tmp_path / 'nowhere.wav'}, which does not exist".encode()
        in proc.stderr
    )
    done = sorted(str(f.relative_to(out)) for f in out.rglob("*.wav"))
    assert done == ["a.wav", "external/c.wav", "old.wav", "sub/b.wav"], done  # nothing under results/
    summary = json.loads(proc.stdout)
    assert (summary["ok"], summary["failed"]) == (3, 1), summary


def test_a_wave_format_extensible_input_stays_extensible(tmp_path: Path, ckpt: str) -> None:
    """A 5.1 WAVE_FORMAT_EXTENSIBLE WAV came out as plain WAVE_FORMAT_PCM, its speaker mask gone."""
    import struct

    src, dst = tmp_path / "surround.wav", tmp_path / "out.wav"
    sf.write(src, np.repeat(noisy(0.3, 48000), 6, axis=1), 48000, format="WAVEX", subtype="PCM_24")
    proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "-q")
    assert proc.returncode == 0, proc.stderr
    head = dst.read_bytes()[:64]
    assert struct.unpack("<H", head[20:22])[0] == 0xFFFE and struct.unpack("<I", head[40:44])[0] == 0x3F
    assert (sf.info(str(dst)).format, sf.info(str(dst)).subtype) == ("WAVEX", "PCM_24")
    # from stdin too, to a file or to stdout (it came out plain there)
    piped = tmp_path / "piped.wav"
    proc = cli("-", "-o", str(piped), "--checkpoint", ckpt, "-q", stdin=src.read_bytes())
    assert proc.returncode == 0 and sf.info(str(piped)).format == "WAVEX", proc.stderr
    proc = cli("-", "-o", "-", "--checkpoint", ckpt, "-q", stdin=src.read_bytes())
    assert proc.returncode == 0 and sf.info(io.BytesIO(proc.stdout)).format == "WAVEX", proc.stderr
    # plain where asked for, and where WAVEX cannot hold the sample format asked for (stereo: IMA ADPCM holds 2)
    sf.write(src, np.repeat(noisy(0.3, 48000), 2, axis=1), 48000, format="WAVEX", subtype="PCM_24")
    for extra, subtype in ((["--format", "WAV"], "PCM_24"), (["--subtype", "IMA_ADPCM"], "IMA_ADPCM")):
        proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "-q", "--overwrite", *extra)
        assert proc.returncode == 0, proc.stderr
        assert (sf.info(str(dst)).format, sf.info(str(dst)).subtype) == ("WAV", subtype)


def test_an_input_named_with_a_leading_dash_gets_a_hint(tmp_path: Path, ckpt: str) -> None:
    """argparse takes "-take1.wav" for an option and said only that inputs are required; the way out is named."""
    sf.write(tmp_path / "-take1.wav", noisy(0.5, 16000), 16000)
    proc = cli("-take1.wav", "-o", "x.wav", "--checkpoint", ckpt, cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "x.wav").exists()
    assert b"(-take1.wav is a file: write ./-take1.wav, or put -- before the inputs)" in proc.stderr, (
        proc.stderr
    )
    proc = cli("--checkpoint", ckpt, "-o", "x.wav", "--", "-take1.wav", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "x.wav").exists(), proc.stderr
    # another mistake, with the file already after --: no hint
    proc = cli("--checkpoint", ckpt, "--chunk-seconds", "x", "-o", "y.wav", "--", "-take1.wav", cwd=tmp_path)
    assert proc.returncode == 2 and b"is a file" not in proc.stderr, proc.stderr


def test_json_quiet_version_help(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--checkpoint", ckpt, "--json", "--quiet")
    assert proc.returncode == 0
    summary = json.loads(proc.stdout)
    f = summary["files"][0]
    assert f["ok"] and f["sample_rate"] == 16000 and f["duration_s"] == 0.5 and f["output"].endswith("o.wav")
    assert "card" not in summary["model"]  # a checkpoint file has no card
    # the bundled model's scores in its metadata are from its export, before later signal-path changes: said so
    bundled = json.loads(cli(str(src), "-o", str(tmp_path / "o2.wav"), "--json", "-q").stdout)["model"]
    assert Path(bundled["card"]) == pretrained_path().with_suffix(".md") and Path(bundled["card"]).is_file()
    assert (
        "evaluation" in bundled["training"]
        and "when these weights were exported" in bundled["evaluation_note"]
    )
    quiet = cli(str(src), "-o", str(tmp_path / "o3.wav"), "--checkpoint", ckpt, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == b"" and quiet.stdout == b""
    assert cli("--version").stdout.decode().startswith("enhance-cli ")
    help_text = cli("--help").stdout.decode()
    assert "Examples:" in help_text and "--competition-map" in help_text
    limit = load_pretrained().model.cfg.max_attenuation_db  # the help names the bundled model's real limit
    assert f"own setting, {limit:g} dB for the bundled 'default'" in " ".join(help_text.split())


def test_usage_errors_exit_2(tmp_path: Path, ckpt: str) -> None:
    proc = cli("x.wav", "--model", "no-such-model")
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()  # one line, no traceback
    assert line.startswith("enhance-cli: error: no bundled model named 'no-such-model' (bundled: "), line
    proc = cli("x.wav", "--checkpoint", str(tmp_path / "nope.safetensors"))
    assert proc.returncode == 2
    assert (
        proc.stderr.decode()
        == f"enhance-cli: error: {tmp_path / 'nope.safetensors'}: no such checkpoint file\n"
    )
    proc = cli("x.wav", "--checkpoint", ckpt, "--competition-map", "m.jpg")
    assert proc.returncode == 2 and b".png or .npz" in proc.stderr
    proc = cli("x.wav", "--checkpoint", ckpt, "--stream-backend", "pytorch")
    assert proc.returncode == 2 and b"--stream-backend needs --stream" in proc.stderr


@pytest.mark.parametrize("backend", ["auto", "pytorch", "torchscript", "onnxruntime"])  # auto: native here
def test_stream_file_mode_equals_offline(tmp_path: Path, ckpt: str, backend: str) -> None:
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    x = noisy(2.3, 16000, channels=2)
    src = tmp_path / "in.wav"
    sf.write(src, x, 16000, subtype="FLOAT")
    proc = cli(
        "--stream",
        "--stream-backend",
        backend,
        str(src),
        "-o",
        str(tmp_path / "o.wav"),
        "--checkpoint",
        ckpt,
        "--competition-map",
        str(tmp_path / "m.npz"),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out, _ = load_audio(tmp_path / "o.wav")
    ref = enhance_audio(
        load_checkpoint(ckpt).model, np.ascontiguousarray(x.T), 16000, return_competition=True
    )
    assert np.abs(out - ref.wav).max() < 1e-5
    assert ref.competition is not None
    assert np.abs(np.load(tmp_path / "m.npz")["block2"] - ref.competition[0]).max() < 1e-5


@pytest.mark.parametrize("backend", ["onnxruntime-int8", "torchscript-int8"])
def test_stream_int8_backend_runs_from_the_cli(tmp_path: Path, ckpt: str, backend: str) -> None:
    """``--stream-backend onnxruntime-int8`` / ``torchscript-int8``: int8 weights, so not the offline samples, but
    the same length and within 20 dB (signal to difference) of them (39 dB when written) for the small test
    model too."""
    if backend == "onnxruntime-int8":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
    x = noisy(2.3, 16000)
    src = tmp_path / "in.wav"
    sf.write(src, x, 16000, subtype="FLOAT")
    out_path = tmp_path / "o.wav"
    proc = cli(
        "--stream",
        "--stream-backend",
        backend,
        str(src),
        "-o",
        str(out_path),
        "--checkpoint",
        ckpt,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    out, _ = load_audio(out_path)
    ref = enhance_audio(load_checkpoint(ckpt).model, np.ascontiguousarray(x.T), 16000).wav
    assert out.shape == ref.shape
    snr = 10 * np.log10(np.sum(ref**2) / np.sum((out - ref) ** 2))
    assert 20.0 < snr < 100.0


def test_a_16_bit_file_holds_the_pipes_samples(ckpt: str, tmp_path: Path) -> None:
    """The 16-bit WAV the CLI writes and the raw pipe's s16le (and the WebSocket stream's) round the same float
    samples the same way. libsndfile rounded 16-bit WAV down, so half the file's samples were one step below the
    pipe's (a review on a GPU saw it first: bench/results/device-cuda.md)."""
    pcm = np.round(noisy(1.3, 16000)[:, 0] * 32768).clip(-32768, 32767).astype(np.int16)
    src, out = tmp_path / "in.wav", tmp_path / "out.wav"
    sf.write(src, pcm, 16000, subtype="PCM_16")
    assert cli(str(src), "-o", str(out), "--checkpoint", ckpt).returncode == 0
    piped = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=pcm.tobytes())
    assert piped.returncode == 0, piped.stderr.decode()
    a = sf.read(out, dtype="int16")[0].astype(np.int32)
    b = np.frombuffer(piped.stdout, np.int16).astype(np.int32)
    assert (
        a.shape == b.shape and np.abs(a - b).max() <= 1
    )  # float rounding can put a sample across a half step
    assert np.mean(a != b) < 0.01


def test_stream_raw_pcm_pipe(ckpt: str) -> None:
    x = noisy(1.7, 16000)[:, 0]
    pcm = np.round(x * 32768).clip(-32768, 32767).astype(np.int16)
    proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=pcm.tobytes())
    assert proc.returncode == 0, proc.stderr.decode()
    out = np.frombuffer(proc.stdout, np.int16)
    assert out.shape == pcm.shape
    ref = enhance_audio(load_checkpoint(ckpt).model, (pcm.astype(np.float32) / 32768)[None], 16000).wav[0]
    assert np.abs(out.astype(np.float32) / 32768 - ref).max() <= 1.0 / 32768 + 1e-6
    # at another rate and with two channels (resampled inside): lengths are kept
    stereo = np.repeat(pcm[:, None], 2, axis=1)
    proc = cli(
        "--stream",
        "-",
        "-o",
        "-",
        "--checkpoint",
        ckpt,
        "--rate",
        "48000",
        "--channels",
        "2",
        stdin=stereo.tobytes(),
    )
    assert proc.returncode == 0 and len(proc.stdout) == stereo.nbytes
    # at 48 kHz in float: the offline result, high band (gated, or dropped) included
    x48 = noisy(1.3, 48000)[:, 0]
    model = load_checkpoint(ckpt).model
    for extra, high_band in (([], True), (["--high-band", "drop"], False)):
        args = ("--stream", "-", "-o", "-", "--checkpoint", ckpt, "--rate", "48000", "--pcm", "f32le", *extra)
        proc = cli(*args, stdin=x48.astype("<f4").tobytes())
        assert proc.returncode == 0, proc.stderr.decode()
        ref = enhance_audio(model, x48[None], 48000, high_band=high_band).wav[0]
        assert np.abs(np.frombuffer(proc.stdout, "<f4") - ref).max() < 1e-5
    bad = cli("--stream", "-", "-o", "x.wav", "--checkpoint", ckpt, stdin=pcm.tobytes())
    assert bad.returncode == 2 and b"use -o -" in bad.stderr
    huge = np.full(100, 3e38, "<f4").tobytes()  # finite, but not audio: NaN came out, with exit 0
    bad = cli("--stream", "-", "-o", "-", "--pcm", "f32le", "--checkpoint", ckpt, stdin=huge)
    assert bad.returncode == 1 and "beyond ±1000".encode() in bad.stderr
    # a NaN ends the stream there, but the 4000 good samples before it all come out (672 stayed in the engine)
    cut = np.concatenate([x[:4000], [np.nan], x[4000:]]).astype("<f4")
    bad = cli("--stream", "-", "-o", "-", "--pcm", "f32le", "--checkpoint", ckpt, stdin=cut.tobytes())
    assert bad.returncode == 1 and b"NaN" in bad.stderr and b"the 4000 samples before it" in bad.stderr
    ref = enhance_audio(model, x[None, :4000].astype(np.float32), 16000).wav[0]
    assert np.abs(np.frombuffer(bad.stdout, "<f4") - ref).max() < 1e-5
    # --resampling low_latency: soxr's LQ filters, close to (not equal to) the offline output
    low = ("--stream", "-", "-o", "-", "--checkpoint", ckpt, "--rate", "48000", "--pcm", "f32le")
    proc = cli(*low, "--resampling", "low_latency", stdin=x48.astype("<f4").tobytes())
    assert proc.returncode == 0 and len(proc.stdout) == x48.astype("<f4").nbytes, proc.stderr.decode()


def test_max_attenuation_flag_overrides_the_model(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "in.wav"
    x = noisy(1.0, 16000)
    sf.write(src, x, 16000, subtype="FLOAT")
    outs = {}
    for flag in ("inf", "0"):
        dst = tmp_path / f"o{flag}.wav"
        assert (
            cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "--max-attenuation-db", flag).returncode == 0
        )
        outs[flag], _ = load_audio(dst)
    ref = enhance_audio(load_checkpoint(ckpt).model, np.ascontiguousarray(x.T), 16000).wav  # tiny: no limit
    assert np.abs(outs["inf"] - ref).max() < 1e-5
    assert np.abs(outs["0"] - ref).max() > 1e-3  # a 0-dB limit keeps at least the noisy magnitude: different


def test_max_attenuation_flag_refuses_negative_and_nan(tmp_path: Path, ckpt: str) -> None:
    """A negative limit would amplify and NaN would write NaN audio: refused before anything is written."""
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.5, 16000), 16000, subtype="FLOAT")
    for flag in ("-3", "nan"):
        dst = tmp_path / "out.wav"
        proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "--max-attenuation-db", flag)
        assert proc.returncode == 2 and b"at least 0 dB" in proc.stderr
        assert not dst.exists()


def test_two_inputs_for_one_output_are_refused_before_anything_is_written(tmp_path: Path, ckpt: str) -> None:
    """Same-named files from two folders into one output folder: even with --overwrite, the second would replace
    the first's output, so it is a usage error up front; likewise two competition maps."""
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        sf.write(tmp_path / sub / "x.wav", noisy(0.5, 16000, seed=len(sub)), 16000)
    ins = [str(tmp_path / "a" / "x.wav"), str(tmp_path / "b" / "x.wav")]
    proc = cli(*ins, "-o", str(tmp_path / "out") + "/", "--overwrite", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"would both be written to" in proc.stderr
    assert not (tmp_path / "out").exists()
    proc = cli(
        str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out") + "/", "--checkpoint", ckpt
    )  # folders: the same relative names
    assert proc.returncode == 2 and b"would both be written to" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_competition_map_is_kept_without_overwrite(tmp_path: Path, ckpt: str) -> None:
    src, dst, maps = tmp_path / "in.wav", tmp_path / "o.wav", tmp_path / "maps.npz"
    sf.write(src, noisy(0.5, 16000), 16000)
    maps.write_bytes(b"keep me")
    proc = cli(str(src), "-o", str(dst), "--competition-map", str(maps), "--checkpoint", ckpt)
    assert proc.returncode == 1 and b"competition map exists (use --overwrite)" in proc.stderr
    assert maps.read_bytes() == b"keep me" and not dst.exists()  # refused before any output was written
    proc = cli(str(src), "-o", str(dst), "--competition-map", str(maps), "--overwrite", "--checkpoint", ckpt)
    assert proc.returncode == 0 and dst.exists() and np.load(maps)  # replaced when asked
    # a map that cannot be written (a file where its folder would be): refused before the audio too (the audio
    # was written, the file reported failed, and a rerun then said "output exists")
    dst.unlink()
    proc = cli(str(src), "-o", str(dst), "--competition-map", str(maps / "m.png"), "--checkpoint", ckpt)
    assert proc.returncode == 1 and b"maps.npz is not a folder" in proc.stderr, proc.stderr
    assert not dst.exists()


def test_rerunning_on_a_folder_does_not_enhance_its_own_outputs(tmp_path: Path, ckpt: str) -> None:
    """Outputs beside the inputs (x.enhanced.wav) or in an output folder inside the input folder are not taken
    as inputs by the next run."""
    tree = tmp_path / "tree"
    tree.mkdir()
    sf.write(tree / "x.wav", noisy(0.5, 16000), 16000)
    for _ in range(2):
        proc = cli(str(tree), "--overwrite", "--checkpoint", ckpt)
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tree.iterdir()) == ["x.enhanced.wav", "x.wav"]
    assert b"left out 1 earlier output" in proc.stderr
    for _ in range(2):
        proc = cli(str(tree), "-o", str(tree / "out") + "/", "--overwrite", "--checkpoint", ckpt)
        assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(tree / "out").as_posix() for p in (tree / "out").rglob("*")) == [
        "x.enhanced.wav",
        "x.wav",
    ]  # the beside-the-input output of the first runs is an input here (its name is all it has)


def test_dev_stdout_as_the_output_is_written_in_place(tmp_path: Path, ckpt: str) -> None:
    """/dev/stdout leads to the file a shell redirected stdout to: a temporary file renamed over the name
    replaced the link (as root, /dev/stdout itself) and left the file empty; or "output exists" refused it. The
    --json summary then goes to stderr, alone, not into the audio."""
    src = tmp_path / "in.wav"
    sf.write(src, noisy(1.0, 16000), 16000)
    link = tmp_path / "mystdout.wav"  # a link of one's own into /proc, as /dev/stdout is
    link.symlink_to("/proc/self/fd/1")
    for out in ("/dev/stdout", str(link)):
        dst = tmp_path / "redirected.wav"
        dst.write_bytes(b"")  # exists: as after the shell's "> redirected.wav"
        with open(dst, "wb") as stdout:
            proc = subprocess.run(
                [sys.executable, "-m", "enhance.cli", str(src), "-o", out, "--checkpoint", ckpt, "--json"],
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=ENV,
                timeout=300,
            )
        assert proc.returncode == 0, proc.stderr.decode()
        assert link.is_symlink()
        info = sf.info(str(dst))
        assert (info.format, info.frames) == ("WAV", 16000)
        assert dst.stat().st_size == 44 + 2 * 16000  # the audio only: no JSON after it
        summary = json.loads(proc.stderr)  # nothing else on stderr
        assert summary["ok"] == 1 and summary["failed"] == 0


def test_a_full_disk_is_not_called_a_corrupt_input(tmp_path: Path, ckpt: str) -> None:
    """A write that fails (here: the file size limit, RLIMIT_FSIZE, as a full disk fails it) was reported as
    "corrupt audio data" of the input; the temporary file and the folder made for it are still removed."""
    import resource
    import signal

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing

    src = tmp_path / "in.wav"
    sf.write(src, noisy(2.0, 16000), 16000)
    for extra in ([], ["--stream"]):
        proc = subprocess.run(
            [sys.executable, "-m", "enhance.cli", str(src), "-o", str(tmp_path / "o" / "x.wav"), *extra],
            capture_output=True,
            env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"},
            preexec_fn=small_files,
            timeout=300,
        )
        assert proc.returncode == 1
        assert b"writing the output failed" in proc.stderr and b"corrupt" not in proc.stderr, proc.stderr
        assert not (tmp_path / "o").exists()


def _as_from_a_terminal() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _signal_while_writing(
    args: list[str], output: Path, sig: int
) -> tuple[bytes, bytes, subprocess.Popen[bytes]]:
    """Run enhance-cli with ``args`` as from a terminal (a job a script started in the background inherits SIGINT
    ignored, and one under nohup SIGHUP, which enhance-cli then leaves ignored, as nohup asks), send ``sig`` once
    ``output``'s temporary file exists, and return stdout, stderr and the finished process."""
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "enhance.cli", *args],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_as_from_a_terminal,
    )
    pattern = f".{output.name}.*.tmp"
    deadline = time.monotonic() + 120
    while not list(output.parent.glob(pattern)) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert list(output.parent.glob(pattern)), f"the run ended before {output.name} was being written"
    proc.send_signal(sig)
    stdout, err = proc.communicate(timeout=120)
    return stdout, err, proc


def test_a_killed_run_leaves_no_temporary_file(tmp_path: Path) -> None:
    """SIGTERM (timeout, kill) in the middle of writing: the temporary output is removed, exit 128 + 15; Ctrl-C
    (SIGINT) is a one-line message and exit 130, not a traceback."""
    import signal

    src = tmp_path / "long.wav"
    sf.write(src, noisy(240.0, 16000), 16000)
    for sig, code, said in (
        (signal.SIGTERM, 143, b"terminated"),
        (
            signal.SIGHUP,
            129,
            b"terminated",
        ),  # the terminal or ssh session went away: it left the temporary file
        (signal.SIGINT, 130, b"interrupted"),
    ):
        out = tmp_path / f"out-{code}"
        # the bundled model: seconds for 240 s of audio (the tiny one was done in 0.6 s, before the signal came)
        _, err, proc = _signal_while_writing([str(src), "-o", str(out / "o.wav")], out / "o.wav", sig)
        assert proc.returncode == code, err
        assert said in err and b"Traceback" not in err
        assert not out.exists()  # nothing left: no temporary file, nor the folder made for the output


def test_ctrl_c_mid_batch_says_what_was_done_and_what_not(tmp_path: Path) -> None:
    """Ctrl-C during the second of three files printed no --json summary and did not say which files were done:
    now the summary comes (with "stopped"), the file in progress and those after it are named, the first
    file's output stays, and the exit is still 130 with nothing of the cut file left."""
    import signal

    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    for name, seconds in (("a.wav", 0.5), ("b.wav", 240.0), ("c.wav", 0.5)):
        sf.write(folder / name, noisy(seconds, 16000), 16000)
    stdout, err, proc = _signal_while_writing(
        [str(folder), "-o", str(out), "--json", "-q"], out / "b.wav", signal.SIGINT
    )
    assert proc.returncode == 130, err
    assert f"stopped during {folder / 'b.wav'}: 1 of 3 files enhanced, 1 not started".encode() in err, err
    summary = json.loads(stdout)
    assert summary["stopped"] is True and (summary["ok"], summary["failed"]) == (1, 2), summary
    errors = [f["error"] for f in summary["files"]]
    assert errors[0] is None and errors[1].endswith("stopped before it was finished"), errors
    assert errors[2].endswith("c.wav: not started"), errors
    assert sorted(p.name for p in out.iterdir()) == ["a.wav"]  # nothing of b.wav, not even its temporary file


@pytest.mark.parametrize("entry", ["cli", "server"])
def test_ctrl_c_while_the_command_loads_is_one_line(tmp_path: Path, entry: str) -> None:
    """Ctrl-C during the second or so that importing torch takes: exit 130 and one line, no traceback through
    torch's import (the console scripts start in enhance.launch, which guards it). A stand-in torch on
    PYTHONPATH holds the command inside that import: it says so on stderr and waits, so the signal always comes
    while the command loads (a fixed wait after the start missed the import on a fast or a loaded machine)."""
    import signal

    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import sys, time\nprint('importing torch', file=sys.stderr, flush=True)\ntime.sleep(600)\n"
    )
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    code = f"import sys; from enhance.launch import {entry}; sys.exit({entry}())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--help"],
        env=env,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first == b"importing torch\n", first + proc.stderr.read()  # the command reached the import
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    name = "enhance-cli" if entry == "cli" else "enhance-server"
    assert proc.returncode == 130, err
    assert err.decode() == f"{name}: interrupted\n"


def test_output_container_and_sample_format(tmp_path: Path, ckpt: str) -> None:
    """--format names the container of a file output too; another container keeps the input's plain sample format
    where it can hold it (else the nearest lower precision); .opus is Opus, not Vorbis; RAW is refused."""
    x = noisy(0.5, 16000)
    sf.write(tmp_path / "a24.flac", x, 16000, subtype="PCM_24")
    sf.write(tmp_path / "af.wav", x, 16000, subtype="FLOAT")
    cases = [
        ("a24.flac", "b.wav", [], ("WAV", "PCM_24")),
        ("a24.flac", "c.wav", ["--format", "flac"], ("FLAC", "PCM_24")),
        ("af.wav", "d.flac", [], ("FLAC", "PCM_24")),
        ("af.wav", "e", ["--format", "WAV"], ("WAV", "FLOAT")),
        ("a24.flac", "f.opus", [], ("OGG", "OPUS")),
        ("a24.flac", "f2.ogg", ["--format", "opus"], ("OGG", "OPUS")),  # as .opus names it (it was refused)
    ]
    for src, dst, extra, want in cases:
        proc = cli(str(tmp_path / src), "-o", str(tmp_path / dst), *extra, "--checkpoint", ckpt)
        assert proc.returncode == 0, proc.stderr
        info = sf.info(tmp_path / dst)
        assert (info.format, info.subtype) == want, dst
    # the in-memory path (stdin in) takes the container and codec from the extension the same way
    proc = cli(
        "-", "-o", str(tmp_path / "i.opus"), "--checkpoint", ckpt, stdin=(tmp_path / "a24.flac").read_bytes()
    )
    assert proc.returncode == 0, proc.stderr
    assert (sf.info(tmp_path / "i.opus").format, sf.info(tmp_path / "i.opus").subtype) == ("OGG", "OPUS")
    # outputs that could never be written are usage errors, before the model loads (they were exit 1 per file)
    for out, extra, says in (
        ("g.raw", [], b"names no sample format: add --format RAW --subtype"),
        ("g.xyz", [], b"cannot write '.xyz' files"),
        ("g.flac", ["--subtype", "FLOAT"], b"--subtype FLOAT: FLAC files cannot hold it"),
        ("g", ["--format", "RAW"], b"RAW output has no header"),
    ):
        proc = cli(str(tmp_path / "a24.flac"), "-o", str(tmp_path / out), *extra, "--checkpoint", ckpt)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert not (tmp_path / out).exists()
    proc = cli(
        str(tmp_path / "a24.flac"), "-o", str(tmp_path / "g"), "--format", "RAW", "--subtype", "PCM_16"
    )
    assert proc.returncode == 0, proc.stderr  # headerless, as asked
    proc = cli(
        str(tmp_path / "a24.flac"), "-o", str(tmp_path / "h.wav"), "--format", "nope", "--checkpoint", ckpt
    )
    assert proc.returncode == 2 and b"--format nope: not a format" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--chunk-seconds", "nan"], b"must be a number of seconds above 0"),
        (["--chunk-seconds", "inf"], b"must be a number of seconds above 0"),
        (["--chunk-seconds", "0"], b"must be a number of seconds above 0"),
        (["--chunk-seconds", "1e306"], b"at most 3600"),  # was an OverflowError per file
        (["--subtype", "bogus"], b"--subtype bogus: not a sample format"),  # was exit 1, per file
        (
            ["--rate", "8000"],
            b"--rate: only for the raw PCM pipe (--stream - -o -)",
        ),  # without --stream - -o -
        (["--stream", "--channels", "0"], b"must be from 1 to 64"),
        (["--stream", "--rate", "1"], b"must be from 1000 to 384000"),
        # not numbers: argparse named the type function ("invalid _seconds value: 'abc'")
        (["--chunk-seconds", "abc"], b"argument --chunk-seconds: expected a number, got 'abc'"),
        (["--max-attenuation-db", "loud"], b"argument --max-attenuation-db: expected a number, got 'loud'"),
        (["--stream", "--channels", "two"], b"argument --channels: expected a whole number, got 'two'"),
        (
            ["--device", "gpu"],
            b"--device gpu: use cpu, cuda or cuda:N (or mps)",
        ),  # not torch's list of 25 types
    ],
)
def test_bad_option_values_are_usage_errors(tmp_path: Path, ckpt: str, flags: list[str], says: bytes) -> None:
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.2, 16000), 16000)
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), *flags, "--checkpoint", ckpt)
    assert proc.returncode == 2 and says in proc.stderr and b"Traceback" not in proc.stderr


def test_cuda_without_cuda_is_a_usage_error(tmp_path: Path, ckpt: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.2, 16000), 16000)
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--device", "cuda", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"no CUDA device here" in proc.stderr and b"Traceback" not in proc.stderr


def test_raw_pipe_reports_a_cut_sample_and_an_encoded_file(tmp_path: Path, ckpt: str) -> None:
    pcm = (noisy(0.3, 16000)[:, 0] * 20000).astype("<i2").tobytes()
    proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, "--json", stdin=pcm + b"\x01")
    assert proc.returncode == 0 and len(proc.stdout) == len(pcm)
    said = "<stdin> ended inside a sample frame: its last 1 byte(s) were left out"
    assert f"enhance-cli: warning: {said}".encode() in proc.stderr
    # and in --json's summary (on stderr, after the warning line), where it was missing
    [result] = json.loads(proc.stderr[proc.stderr.index(b"\n{") :])["files"]
    assert result["warnings"] and result["warnings"][0].startswith(said), result
    buf = io.BytesIO()
    sf.write(buf, noisy(0.3, 16000), 16000, format="FLAC")
    proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=buf.getvalue())
    assert proc.returncode == 1 and b"starts like an encoded audio file (FLAC)" in proc.stderr
    assert proc.stdout == b""
    buf = io.BytesIO()  # CAF and tagged MP3 were enhanced as if they were PCM (exit 0)
    sf.write(buf, noisy(0.3, 16000), 16000, format="CAF")
    for encoded, head in ((buf.getvalue(), b"CAF"), (b"ID3\x04\x00" + bytes(3200), b"MP3 (an ID3 tag)")):
        proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=encoded)
        assert proc.returncode == 1 and b"starts like an encoded audio file (" + head in proc.stderr, (
            proc.stderr
        )
    if "MP3" in sf.available_formats():  # untagged (libsndfile writes none): noise out, exit 0
        buf = io.BytesIO()
        sf.write(buf, noisy(0.3, 16000), 16000, format="MP3")
        assert buf.getvalue()[:1] == b"\xff"  # what the test is about: a bare frame header, no ID3 tag
        proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=buf.getvalue())
        # named, not its first bytes shown as text (mojibake for a frame header)
        assert proc.returncode == 1 and b"starts like an encoded audio file (MP3)" in proc.stderr, proc.stderr
    # PCM that starts with a valid MPEG frame header, but no second one a frame later, is PCM
    header = bytes.fromhex("fff388c4")  # MPEG-2 layer III, 64 kbit/s at 16 kHz: frames of 288 bytes
    proc = cli("--stream", "-", "-o", "-", "--checkpoint", ckpt, stdin=header + pcm)
    assert proc.returncode == 0 and len(proc.stdout) == len(header + pcm), proc.stderr
    # no BytesIO repr in the reason
    proc = cli("-", "-o", "-", "--checkpoint", ckpt, stdin=b"garbage, not audio")
    assert proc.returncode == 1 and b"<stdin>: not a readable audio file (Error opening it" in proc.stderr


def test_png_maps_without_matplotlib_are_refused_before_any_work(tmp_path: Path, ckpt: str) -> None:
    """The viz extra missing: the output was written, then the PNG failed (exit 1), and a rerun needed
    --overwrite. A stand-in package that fails to import, as an absent one does."""
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    src, dst = tmp_path / "in.wav", tmp_path / "o.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)])}
    args = [str(src), "-o", str(dst), "--competition-map", str(tmp_path / "m.png"), "--checkpoint", ckpt]
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args], capture_output=True, env=env, timeout=120
    )
    assert proc.returncode == 2 and b"drawing .png maps needs matplotlib" in proc.stderr
    assert not dst.exists()
    args[4] = str(tmp_path / "m.npz")  # the data form needs no matplotlib
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args], capture_output=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and dst.exists() and (tmp_path / "m.npz").exists()


def test_format_names_the_outputs_it_makes(tmp_path: Path, ckpt: str) -> None:
    """--format FLAC with names made from the inputs: .flac files (FLAC data in files named .wav, before)."""
    d = tmp_path / "rec"
    (d / "sub").mkdir(parents=True)
    for name in ("a.wav", "sub/b.wav"):
        sf.write(d / name, noisy(0.3, 16000), 16000)
    proc = cli(str(d), "-o", str(tmp_path / "out"), "--format", "flac", "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    made = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.*"))
    assert made == ["a.flac", "sub/b.flac"]
    assert all(sf.info(str(p)).format == "FLAC" for p in (tmp_path / "out").rglob("*.flac"))
    proc = cli(str(d / "a.wav"), "--format", "FLAC", "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(d / "a.enhanced.flac")).format == "FLAC" and not (d / "a.enhanced.wav").exists()
    # WAVEX is a .wav (it was named .wavex, which no player knew and folder scans skipped)
    proc = cli(str(d / "sub" / "b.wav"), "--format", "wavex", "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(d / "sub" / "b.enhanced.wav")).format == "WAVEX"


def test_a_folder_or_glob_of_one_file_writes_into_the_output_folder(tmp_path: Path, ckpt: str) -> None:
    d = tmp_path / "one"
    d.mkdir()
    sf.write(d / "x.wav", noisy(0.3, 16000), 16000)
    for source, out in ((str(d), tmp_path / "cleaned"), (str(d / "*.wav"), tmp_path / "cleaned2")):
        proc = cli(source, "-o", str(out), "--checkpoint", ckpt)  # no trailing '/'
        assert proc.returncode == 0, proc.stderr.decode()
        assert (out / "x.wav").is_file()
    proc = cli(str(d), "-o", "-", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"-o - takes a single file" in proc.stderr


def test_rerunning_a_glob_does_not_enhance_its_own_outputs(tmp_path: Path, ckpt: str) -> None:
    d = tmp_path / "g"
    d.mkdir()
    sf.write(d / "a.wav", noisy(0.3, 16000), 16000)
    for _ in range(2):
        proc = cli(str(d / "*.wav"), "--overwrite", "--checkpoint", ckpt)
        assert proc.returncode == 0, proc.stderr.decode()
    assert sorted(p.name for p in d.iterdir()) == ["a.enhanced.wav", "a.wav"]
    assert b"left out 1 earlier output" in proc.stderr


def test_an_output_folder_above_the_inputs_keeps_them_inputs(tmp_path: Path, ckpt: str) -> None:
    """``rec/raw -o rec/``: every file under the output folder was left out as "an earlier output" (exit 2, or,
    beside another input, silently not enhanced); that is only so for an output folder inside the searched one."""
    rec, other = tmp_path / "rec", tmp_path / "other"
    (rec / "raw").mkdir(parents=True)
    other.mkdir()
    sf.write(rec / "raw" / "t1.wav", noisy(0.3, 16000), 16000)
    sf.write(other / "b.wav", noisy(0.3, 16000, seed=1), 16000)
    proc = cli(str(rec / "raw"), str(other), "-o", f"{rec}/", "--checkpoint", ckpt)
    assert proc.returncode == 0 and b"earlier output" not in proc.stderr, proc.stderr
    assert (rec / "t1.wav").is_file() and (rec / "b.wav").is_file()
    proc = cli(str(rec / "raw" / "*.wav"), "-o", f"{tmp_path / 'flat'}/", "--checkpoint", ckpt)
    assert proc.returncode == 0 and (tmp_path / "flat" / "t1.wav").is_file(), proc.stderr
    proc = cli(
        str(rec / "raw" / "*.wav"), "-o", f"{tmp_path}/", "--checkpoint", ckpt
    )  # the glob's grandparent
    assert proc.returncode == 0 and (tmp_path / "t1.wav").is_file(), proc.stderr
    # a glob over the output folder's parent still leaves the earlier outputs out
    proc = cli(str(other / "**" / "*.wav"), "-o", f"{other / 'out'}/", "--checkpoint", ckpt)
    assert proc.returncode == 0 and (other / "out" / "b.wav").is_file(), proc.stderr
    proc = cli(str(other / "**" / "*.wav"), "-o", f"{other / 'out'}/", "--overwrite", "--checkpoint", ckpt)
    assert proc.returncode == 0 and b"left out 1 earlier output" in proc.stderr, proc.stderr


def test_an_input_without_extension_keeps_its_container(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "recording"
    sf.write(src, noisy(0.3, 16000), 16000, format="FLAC")
    proc = cli(str(src), "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(tmp_path / "recording.enhanced.flac")).format == "FLAC"


def test_pipes_as_input_files(tmp_path: Path, ckpt: str) -> None:
    """A named pipe (or /dev/stdin, <(...)) has no size and cannot be read twice: it is read into memory, not
    refused as an empty file."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    fifo = tmp_path / "fifo.wav"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "enhance.cli", str(fifo), "-o", str(tmp_path / "o.wav"), "--checkpoint", ckpt],
        env=ENV,
        stderr=subprocess.PIPE,
    )
    with open(fifo, "wb") as f:
        f.write(src.read_bytes())
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert sf.info(str(tmp_path / "o.wav")).frames == sf.info(str(src)).frames


def test_a_reader_that_goes_away_is_an_error(tmp_path: Path, ckpt: str) -> None:
    """-o - into a pipe closed after 100 bytes: exit 1 with a message, not 0 with a cut output."""
    src = tmp_path / "long.wav"
    sf.write(src, noisy(6.0, 48000, 2), 48000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "enhance.cli", str(src), "-o", "-", "--checkpoint", ckpt],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 1, err.decode()
    assert f"{src}: stdout was closed before all of the enhanced audio was written".encode() in err, err
    assert b"Traceback" not in err and b"Exception ignored" not in err, err


def test_more_usage_errors(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 16000), 16000)
    proc = cli("--stream", "-", "-o", "-", "--competition-map", str(tmp_path / "m.npz"), "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"not available on the raw PCM pipe" in proc.stderr
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--device", "meta", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"--device meta" in proc.stderr
    proc = cli(str(src), "-o", str(tmp_path / "o.wav"), "--competition-map", str(tmp_path / "M.NPZ"))
    assert proc.returncode == 0, proc.stderr.decode()
    assert (tmp_path / "M.NPZ").is_file()
    # the input folder as the output folder: "left out 1 earlier output file(s)", then "no input files matched"
    proc = cli(str(tmp_path), "-o", f"{tmp_path}/", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"is the input folder" in proc.stderr, proc.stderr
    # stdin twice: the first took all of it and its audio went out, then the second failed ("empty input")
    proc = cli("-", "-", "--checkpoint", ckpt, stdin=src.read_bytes())
    assert proc.returncode == 2 and b"can be read only once" in proc.stderr and not proc.stdout
    # started with stdout closed (>&-): an AttributeError per file
    proc = subprocess.run(
        [sys.executable, "-m", "enhance.cli", str(src), "-o", "-", "--checkpoint", ckpt],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=ENV,
        timeout=300,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 2 and b"stdout is closed" in proc.stderr, proc.stderr


def test_opus_output_at_a_rate_opus_cannot_take(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 44100), 44100)
    proc = cli(str(src), "-o", str(tmp_path / "a.opus"), "--checkpoint", ckpt)
    assert proc.returncode == 1
    assert b"Opus" in proc.stderr and b"44100" in proc.stderr and b".tmp" not in proc.stderr
    assert list(tmp_path.iterdir()) == [src]
    sf.write(src, noisy(0.3, 48000), 48000)
    assert cli(str(src), "-o", str(tmp_path / "a.opus"), "--checkpoint", ckpt, "--overwrite").returncode == 0
    assert sf.info(str(tmp_path / "a.opus")).subtype == "OPUS"


def test_ogg_vorbis_output_above_200_khz_is_refused(tmp_path: Path, ckpt: str) -> None:
    """libsndfile's Vorbis encoder crashes the process above 200 kHz: refused before anything is written."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.05, 256000), 256000)
    proc = cli(str(src), "-o", str(tmp_path / "a.ogg"), "--checkpoint", ckpt)
    assert proc.returncode == 1, proc.stderr.decode()
    assert b"Ogg Vorbis takes audio up to 200 kHz" in proc.stderr and b"256000 Hz" in proc.stderr
    assert list(tmp_path.iterdir()) == [src]
    assert cli(str(src), "-o", str(tmp_path / "a.flac"), "--checkpoint", ckpt).returncode == 0


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile writes no MP3")
def test_mp3_output_at_a_rate_mp3_cannot_take(tmp_path: Path, ckpt: str) -> None:
    """libsndfile's own error named the temporary file and was cut off mid-list of rates."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.05, 96000), 96000)
    proc = cli(str(src), "-o", str(tmp_path / "a.mp3"), "--checkpoint", ckpt)
    assert proc.returncode == 1, proc.stderr.decode()
    assert (
        b"MP3 takes 8, 11.025, 12, 16, 22.05, 24, 32, 44.1 or 48 kHz audio and this is 96000 Hz (outputs keep the "
        b"input's rate and channels): write .flac or .wav instead" in proc.stderr
    ), proc.stderr
    assert b".tmp" not in proc.stderr and list(tmp_path.iterdir()) == [src]


@pytest.mark.parametrize(
    ("channels", "suffix", "says"),
    [
        (
            9,
            ".flac",
            b"FLAC holds at most 8 channels and this has 9 (outputs keep the input's rate and channels): "
            b"write .wav instead",
        ),
        pytest.param(
            3,
            ".mp3",
            b"MP3 holds at most 2 channels and this has 3 (outputs keep the input's rate and channels): write "
            b".flac or .wav instead",
            marks=pytest.mark.skipif(
                "MP3" not in sf.available_formats(), reason="this libsndfile writes no MP3"
            ),
        ),
    ],
)
def test_more_channels_than_the_output_format_holds(
    tmp_path: Path, ckpt: str, channels: int, suffix: str, says: bytes
) -> None:
    """libsndfile's own error was "Format not recognised", naming the temporary file."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.2, 16000, channels=channels), 16000)
    for mode in ([], ["--stream"]):
        proc = cli(str(src), "-o", str(tmp_path / f"a{suffix}"), "--checkpoint", ckpt, *mode)
        assert proc.returncode == 1 and says in proc.stderr, proc.stderr
        assert b".tmp" not in proc.stderr and list(tmp_path.iterdir()) == [src]


def test_a_rate_flac_cannot_hold_suggests_wav_only() -> None:
    from enhance.audio_io import codec_error, format_fallback

    assert codec_error("FLAC", None, 768000) == "FLAC takes audio up to 655350 Hz and this is 768000 Hz"
    assert (
        format_fallback("FLAC", 768000) == format_fallback("OGG", 768000) == ".wav"
    )  # it said ".flac or .wav"
    assert format_fallback("MP3", 96000) == ".flac or .wav"
    assert codec_error("MP3", None, 44100) is None and codec_error("MP3", None, 44000) is not None
    assert codec_error("FLAC", None, 16000, 9) == "FLAC holds at most 8 channels and this has 9"
    assert codec_error("MP3", None, 16000, 3) == "MP3 holds at most 2 channels and this has 3"
    assert format_fallback("MP3", 16000, 3) == ".flac or .wav" and format_fallback("OGG", 16000, 9) == ".wav"


def test_a_container_that_would_store_another_rate_is_refused(tmp_path: Path, ckpt: str) -> None:
    """libsndfile writes some containers at another rate without an error (XI is always 44.1 kHz, SVX keeps the
    rate in 16 bits, HTK stores a period): the output played at the wrong speed and the run said "ok"."""
    from enhance.audio_io import codec_error

    assert codec_error("SVX", None, 96000) == (
        "SVX cannot store 96000 Hz (its header would say 30464 Hz: the audio would play at the wrong speed)"
    )
    assert codec_error("HTK", None, 22050) is not None and codec_error("HTK", None, 16000) is None
    assert codec_error("SVX", None, 48000) is None and codec_error("WAV", None, 96000) is None
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.2, 16000), 16000)
    proc = cli(str(src), "-o", str(tmp_path / "a.xi"), "--checkpoint", ckpt)
    assert proc.returncode == 1, proc.stderr
    assert b"XI cannot store 16000 Hz (its header would say 44100 Hz" in proc.stderr, proc.stderr
    assert b"write .flac or .wav instead" in proc.stderr and list(tmp_path.iterdir()) == [src]


def test_an_output_never_replaces_another_input(tmp_path: Path, ckpt: str) -> None:
    """``a.wav a.enhanced.wav --overwrite``: a.wav's output is the second input; it was replaced, then enhanced
    again."""
    d = tmp_path / "x"
    d.mkdir()
    sf.write(d / "a.wav", noisy(0.3, 16000), 16000)
    sf.write(d / "a.enhanced.wav", noisy(0.3, 8000, seed=1), 8000)
    before = (d / "a.enhanced.wav").read_bytes()
    proc = cli(str(d / "a.wav"), str(d / "a.enhanced.wav"), "--overwrite", "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"would overwrite another input" in proc.stderr, proc.stderr
    assert (d / "a.enhanced.wav").read_bytes() == before
    assert sorted(p.name for p in d.iterdir()) == ["a.enhanced.wav", "a.wav"]
    # the same before the second input exists: a.wav's output would be written, then enhanced as that input
    (d / "a.enhanced.wav").unlink()
    proc = cli(str(d / "a.wav"), str(d / "a.enhanced.wav"), "--checkpoint", ckpt)
    assert proc.returncode == 2, proc.stderr
    assert f"the output of {d / 'a.wav'} is also given as an input".encode() in proc.stderr, proc.stderr
    assert sorted(p.name for p in d.iterdir()) == ["a.wav"]


def test_several_inputs_into_an_audio_file_name_is_a_usage_error(tmp_path: Path, ckpt: str) -> None:
    """``a.wav b.wav -o one.wav`` made a folder named one.wav; a name ending in '/' still makes that folder."""
    for name in ("a.wav", "b.wav"):
        sf.write(tmp_path / name, noisy(0.3, 16000), 16000)
    ins = [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]
    proc = cli(*ins, "-o", str(tmp_path / "one.wav"), "--checkpoint", ckpt)
    assert proc.returncode == 2 and b"this is an audio file name" in proc.stderr, proc.stderr
    assert not (tmp_path / "one.wav").exists()
    assert cli(*ins, "-o", f"{tmp_path / 'one.wav'}/", "--checkpoint", ckpt).returncode == 0
    assert sorted(p.name for p in (tmp_path / "one.wav").iterdir()) == ["a.wav", "b.wav"]


def test_several_inputs_into_an_existing_file_is_a_usage_error(tmp_path: Path, ckpt: str) -> None:
    for name in ("a.wav", "b.wav"):
        sf.write(tmp_path / name, noisy(0.3, 16000), 16000)
    (tmp_path / "out.wav").write_bytes(b"keep")
    proc = cli(
        str(tmp_path / "a.wav"),
        str(tmp_path / "b.wav"),
        "-o",
        str(tmp_path / "out.wav"),
        "--checkpoint",
        ckpt,
    )
    assert proc.returncode == 2 and b"need a folder" in proc.stderr, proc.stderr
    assert (tmp_path / "out.wav").read_bytes() == b"keep"


def test_pipe_inputs_name_their_outputs_without_reading_the_pipe(tmp_path: Path, ckpt: str) -> None:
    """/dev/stdin (or <(...)) into a folder: the name is made without probing the pipe (the probe took its
    header, and the enhancement then failed); beside the input there is no place to write."""
    src = tmp_path / "a.flac"
    sf.write(src, noisy(0.5, 16000), 16000, format="FLAC")
    out = tmp_path / "out"
    proc = cli("/dev/stdin", "-o", f"{out}/", "--checkpoint", ckpt, stdin=src.read_bytes())
    assert proc.returncode == 0, proc.stderr.decode()
    (made,) = list(out.iterdir())
    assert made.name == "stdin.wav" and sf.info(str(made)).frames == sf.info(str(src)).frames
    proc = cli("/dev/stdin", "--checkpoint", ckpt, stdin=src.read_bytes())
    assert proc.returncode == 2 and b"a pipe or device has no folder to write beside" in proc.stderr
    # stdin redirected from a regular file (`< a.flac`): /dev/stdin leads to that file, and the output was written
    # as /dev/stdin.enhanced.wav (as root) or failed on a temporary file in /dev
    with src.open("rb") as redirected:
        proc = subprocess.run(
            [sys.executable, "-m", "enhance.cli", "/dev/stdin", "--checkpoint", ckpt],
            stdin=redirected,
            capture_output=True,
            env=ENV,
            timeout=300,
        )
    assert proc.returncode == 2 and b"a pipe or device has no folder to write beside" in proc.stderr
    assert not Path("/dev/stdin.enhanced.wav").exists()


def test_a_named_pipe_with_a_competition_map(tmp_path: Path, ckpt: str) -> None:
    """The map's spectrogram read the input a second time: a named pipe then hung the run for good."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    fifo = tmp_path / "fifo.wav"
    os.mkfifo(fifo)
    maps = tmp_path / "m.png"
    args = [str(fifo), "-o", str(tmp_path / "o.wav"), "--competition-map", str(maps), "--checkpoint", ckpt]
    proc = subprocess.Popen([sys.executable, "-m", "enhance.cli", *args], env=ENV, stderr=subprocess.PIPE)
    with open(fifo, "wb") as f:
        f.write(src.read_bytes())
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    assert maps.read_bytes().startswith(b"\x89PNG")


def test_special_outputs_are_written_in_place(tmp_path: Path, ckpt: str) -> None:
    """/dev/stdout, /dev/null or a named pipe: written to, never replaced by a renamed temp file (a FIFO became a
    regular file, and its reader waited for ever; /dev/stdout was "output exists")."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    proc = cli(str(src), "-o", "/dev/stdout", "-q", "--checkpoint", ckpt)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(io.BytesIO(proc.stdout)).frames == 8000  # WAV: the name says no format
    fifo = tmp_path / "out.flac"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    proc = cli(str(src), "-o", str(fifo), "--overwrite", "--checkpoint", ckpt)
    reader.join(timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sf.info(io.BytesIO(got[0])).format == "FLAC"  # the name's format


@pytest.mark.parametrize("module", ["enhance.cli", "server.main", "recipes.evaluate"])
def test_commands_set_a_passive_openmp_wait_policy_before_torch_loads(module: str) -> None:
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads it: each command module sets PASSIVE (unless the user
    set a policy) before anything imports torch (bench/bench_wait_policy.py times it beside busy processes).
    The import log (-X importtime, in import order) shows the setting module first."""
    code = f"import os, {module}; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in ENV.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout == "PASSIVE\n", proc.stdout + proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert imported.index("enhance.wait_policy") < imported.index("torch"), imported[:40]
    user = subprocess.run(
        [sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True, text=True
    )
    assert user.stdout == "ACTIVE\n", user.stderr  # a policy the user set is kept


def test_audio_to_a_terminal_is_refused(tmp_path: Path, ckpt: str) -> None:
    """``-o -`` with stdout on a terminal (here a pseudo-terminal) would print binary audio: a usage error, and
    nothing written to the terminal."""
    import pty

    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 16000), 16000)
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "enhance.cli", str(src), "-o", "-", "--checkpoint", ckpt],
            env=ENV,
            stdout=secondary,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        os.set_blocking(primary, False)
        try:
            shown = os.read(primary, 1 << 16)
        except BlockingIOError:
            shown = b""
    finally:
        os.close(primary)
        os.close(secondary)
    assert proc.returncode == 2, proc.stderr
    assert b"would write binary audio to the terminal" in proc.stderr and shown == b"", (proc.stderr, shown)


def _run_cli(*args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    """``cli`` with the standard streams given by the caller (a file, a closed stream, a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "enhance.cli", *args], capture_output=False, env=ENV, timeout=300, **kw
    )


def test_stdin_or_a_map_that_would_replace_an_input(tmp_path: Path, ckpt: str) -> None:
    """``- -o in.wav --overwrite < in.wav`` replaced its input (the same through /dev/stdin was refused), and a
    map named like its input (``take.npz``) replaced the audio with a zip archive."""
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.3, 16000), 16000)
    before = src.read_bytes()
    with open(src, "rb") as stdin:
        proc = _run_cli(
            "-", "-o", str(src), "--overwrite", "--checkpoint", ckpt, stdin=stdin, stderr=subprocess.PIPE
        )
    assert proc.returncode == 2 and b"stdin is read from this file" in proc.stderr, proc.stderr
    take = tmp_path / "take.npz"
    take.write_bytes(before)  # audio whose name ends .npz
    proc = cli(
        str(take),
        "-o",
        str(tmp_path / "t.wav"),
        "--competition-map",
        str(take),
        "--overwrite",
        "--checkpoint",
        ckpt,
    )
    assert proc.returncode == 2 and b"is an input file; the map would replace it" in proc.stderr, proc.stderr
    assert src.read_bytes() == before == take.read_bytes() and not (tmp_path / "t.wav").exists()
    # the audio output's own name: the map replaced the enhanced audio, and the run said "ok"
    same = tmp_path / "out.npz"
    proc = cli(
        str(src), "-o", str(same), "--format", "WAV", "--competition-map", str(same), "--checkpoint", ckpt
    )
    assert proc.returncode == 2, proc.stderr
    assert b"is also an audio output; the map would replace the enhanced audio" in proc.stderr, proc.stderr
    assert not same.exists()


def test_output_paths_that_cannot_be_written_say_why(tmp_path: Path, ckpt: str) -> None:
    """Each said "output exists (written meanwhile by another run; use --overwrite)" or named a temporary file."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 16000, channels=3), 16000)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "dl.wav").symlink_to(tmp_path / "nowhere" / "x.wav")
    for dst, says in [
        ("notes.txt/clean.wav", b"notes.txt is a file, not a folder"),
        ("dl.wav", b"output exists, a symbolic link to a missing file (use --overwrite)"),
        ("x.sd2", b"SD2 files are not written"),  # libsndfile left a "._" file beside it, and exit 0
        (
            "x.htk",
            b"Format not recognised; it cannot hold 3 channel(s) at 16000 Hz: write .flac or .wav instead",
        ),
    ]:
        proc = cli(str(src), "-o", str(tmp_path / dst), "--checkpoint", ckpt)
        assert proc.returncode in (1, 2) and says in proc.stderr, (dst, proc.stderr)
        assert b".tmp" not in proc.stderr and b"meanwhile" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.wav", "dl.wav", "notes.txt"]


def test_a_map_that_fails_after_the_audio_names_the_audio(tmp_path: Path, ckpt: str) -> None:
    """The audio was kept but the summary said output null, so a rerun's "output exists" came as a surprise."""
    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 16000), 16000)
    (tmp_path / "maps" / "a.competition.png").mkdir(parents=True)  # passes the checks with --overwrite
    proc = cli(
        str(src),
        "-o",
        str(tmp_path / "o.wav"),
        "--competition-map",
        f"{tmp_path / 'maps'}/",
        "--overwrite",
        "--json",
        "--checkpoint",
        ckpt,
    )
    assert (
        proc.returncode == 1 and b"enhanced into" in proc.stderr and b"competition map failed" in proc.stderr
    )
    [result] = json.loads(proc.stdout)["files"]
    assert result["ok"] is False and result["output"] == str(tmp_path / "o.wav"), result
    assert sf.info(str(tmp_path / "o.wav")).frames == 4800


def test_streams_and_options_that_were_taken_silently(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "loud.wav"
    x = noisy(0.5, 16000) * 20  # float samples beyond 1: FLOAT keeps them
    sf.write(src, x, 16000, subtype="FLOAT")
    for subtype in ("FLOAT", "float"):  # 'float' clipped the output to [-1, 1]
        dst = tmp_path / f"o-{subtype}.wav"
        assert cli(str(src), "-o", str(dst), "--subtype", subtype, "--checkpoint", ckpt).returncode == 0
        assert np.abs(sf.read(dst)[0]).max() > 2, subtype
    # closed stdin: "unexpected AttributeError: 'NoneType' object has no attribute 'buffer'"
    proc = _run_cli(
        "-",
        "-o",
        str(tmp_path / "c.wav"),
        "--checkpoint",
        ckpt,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.close(0),
    )
    assert proc.returncode == 2 and b"stdin is closed" in proc.stderr, proc.stderr
    # the raw pipe wrote s16 samples into "o.flac" and exited 0
    proc = cli("--stream", "-", "-o", "-", "--format", "FLAC", "--checkpoint", ckpt, stdin=b"\0\0" * 1600)
    assert proc.returncode == 2 and b"--format and --subtype are for files" in proc.stderr, proc.stderr


def test_a_name_of_stdout_on_a_terminal_is_refused(tmp_path: Path, ckpt: str) -> None:
    """``-o -`` on a terminal was refused, ``-o /dev/stdout`` dumped RIFF... onto it."""
    import pty

    src = tmp_path / "a.wav"
    sf.write(src, noisy(0.3, 16000), 16000)
    leader, follower = pty.openpty()
    try:
        proc = _run_cli(
            str(src), "-o", "/dev/stdout", "--checkpoint", ckpt, stdout=follower, stderr=subprocess.PIPE
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2 and b"would write binary audio to the terminal" in proc.stderr, proc.stderr
    leader, follower = pty.openpty()
    try:  # stdin in, no -o: stdout, here a terminal (the message said "-o None")
        with open(src, "rb") as stdin:
            proc = _run_cli("-", "--checkpoint", ckpt, stdin=stdin, stdout=follower, stderr=subprocess.PIPE)
    finally:
        os.close(follower)
        os.close(leader)
    assert proc.returncode == 2, proc.stderr  # (it then said "-o -", which the user never typed)
    assert (
        b"stdout (where stdin's audio goes without -o) would write binary audio to the terminal"
        in proc.stderr
    )


@pytest.mark.skipif("MP3" not in sf.available_formats(), reason="this libsndfile writes no MP3")
def test_a_truncated_input_gives_what_decodes_and_a_warning(tmp_path: Path, ckpt: str) -> None:
    """A cut MP3's header still gives the whole length: the output was padded to it with the reader's stale
    buffer (the first block again), with exit 0 and no word. Now it holds what decodes, and says so."""
    src, cut = tmp_path / "long.mp3", tmp_path / "cut.mp3"
    sf.write(src, noisy(6.0, 16000), 16000)
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    header, decoded = sf.info(str(cut)).frames, len(sf.read(str(cut))[0])
    assert decoded < header  # what the test is about
    dst = tmp_path / "out.wav"
    proc = cli(str(cut), "-o", str(dst), "--checkpoint", ckpt, "-q", "--chunk-seconds", "0.5")
    assert proc.returncode == 0, proc.stderr.decode()
    assert f"ends after {decoded} of the {header} frames".encode() in proc.stderr
    assert b"enhance-cli: warning:" in proc.stderr
    out, _ = sf.read(str(dst))
    assert len(out) == decoded


@pytest.mark.parametrize(("fmt", "ext"), [("WAV", "wav"), ("AIFF", "aiff")])
def test_a_cut_wav_or_aiff_is_enhanced_with_the_warning_too(
    tmp_path: Path, ckpt: str, fmt: str, ext: str
) -> None:
    """libsndfile shortens a cut WAV's or AIFF's frame count to what the file holds, so the warning a cut FLAC
    or MP3 gets never came (exit 0, nothing said, half the audio). Now it does; the whole file gets none, nor
    does a WAV whose sizes are a streaming writer's "unknown" (ffmpeg or sox writing to a pipe)."""
    whole, cut = tmp_path / f"whole.{ext}", tmp_path / f"cut.{ext}"
    sf.write(whole, noisy(2.0, 16000), 16000, format=fmt, subtype="PCM_16")
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    there = sf.info(str(cut)).frames
    proc = cli(str(cut), "-o", str(tmp_path / f"out.{ext}"), "--checkpoint", ckpt, "-q")
    assert proc.returncode == 0, proc.stderr.decode()
    said = re.search(
        rb"warning: \S*cut\.\w+: the file ends after (\d+) of the about (\d+) frames", proc.stderr
    )
    assert said and int(said[1]) == there and abs(int(said[2]) - 32000) <= 100, proc.stderr
    assert sf.info(str(tmp_path / f"out.{ext}")).frames == there
    proc = cli(str(whole), "-o", str(tmp_path / f"out2.{ext}"), "--checkpoint", ckpt, "-q")
    assert proc.returncode == 0 and b"warning" not in proc.stderr, proc.stderr
    if fmt == "WAV":  # RIFF and data sizes 0xFFFFFFFF, as a writer that cannot seek back leaves them
        unknown = bytearray(data)
        at = unknown.find(b"data")
        unknown[4:8] = unknown[at + 4 : at + 8] = b"\xff\xff\xff\xff"
        proc = cli("-", "-o", str(tmp_path / "out3.wav"), "--checkpoint", ckpt, "-q", stdin=bytes(unknown))
        assert proc.returncode == 0 and b"warning" not in proc.stderr, proc.stderr


def test_a_pipe_that_is_not_audio_is_refused_after_its_first_mib(tmp_path: Path, ckpt: str) -> None:
    """``enhance-cli /dev/zero`` read until the kernel killed it (23 GB); a producer's text on stdin was read
    whole before libsndfile refused it. Now the first MiB must show audio; audio of more than a MiB still comes
    through a pipe whole."""
    endless = cli("/dev/zero", "-o", str(tmp_path / "z.wav"), "--checkpoint", ckpt)  # (a 300-s timeout)
    err = endless.stderr
    assert endless.returncode == 1 and b"/dev/zero: not a readable audio file" in err, err
    assert b"first MiB" in err and not (tmp_path / "z.wav").exists()
    proc = cli(
        "-", "-o", str(tmp_path / "t.wav"), "--checkpoint", ckpt, stdin=b"hello, not audio\n" * 100_000
    )
    assert proc.returncode == 1 and b"<stdin>: not a readable audio file" in proc.stderr, proc.stderr
    buf = io.BytesIO()
    sf.write(buf, noisy(40.0, 16000), 16000, format="WAV", subtype="PCM_16")  # 1.2 MiB
    proc = cli("-", "-o", str(tmp_path / "long.wav"), "--checkpoint", ckpt, stdin=buf.getvalue())
    assert proc.returncode == 0, proc.stderr.decode()
    assert sf.info(str(tmp_path / "long.wav")).frames == 40 * 16000


def _decodable_frames(path: Path, piece: int = 256) -> int:
    """How many frames of ``path`` decode, read from the start in short pieces until libsndfile fails."""
    n = 0
    with contextlib.suppress(sf.LibsndfileError), sf.SoundFile(str(path)) as f:
        while len(block := f.read(piece)):
            n += len(block)
    return n


@pytest.mark.parametrize("mode", [[], ["--stream"]], ids=["offline", "stream"])
def test_a_cut_flac_gives_what_decodes_and_a_warning(tmp_path: Path, ckpt: str, mode: list[str]) -> None:
    """A cut MP3 ends early; a cut FLAC fails ("flac decoder lost sync") and was refused whole as corrupt,
    0.3 % short or 40 %. Now, as for MP3, what decodes is enhanced (up to the last 1024-frame piece that decodes),
    the same samples as the whole file's up to near the cut, and the user is told."""
    whole, cut = tmp_path / "whole.flac", tmp_path / "cut.flac"
    sf.write(whole, noisy(6.0, 16000), 16000, subtype="PCM_16")
    data = whole.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.6)])
    header, decodable = sf.info(str(cut)).frames, _decodable_frames(cut)
    assert 0 < decodable < header
    with pytest.raises(sf.LibsndfileError):  # what the test is about: the plain read fails
        sf.read(str(cut))
    outs = []
    for src in (whole, cut):
        dst = tmp_path / f"{src.stem}.out.wav"
        proc = cli(str(src), "-o", str(dst), "--checkpoint", ckpt, "-q", "--chunk-seconds", "0.5", *mode)
        assert proc.returncode == 0, proc.stderr.decode()
        outs.append(sf.read(str(dst))[0])
    n = len(outs[1])
    assert decodable - 1024 < n <= decodable
    assert f"ends after {n} of the {header} frames".encode() in proc.stderr and b"warning:" in proc.stderr
    near_cut = n - 1024  # the last frames before the cut are processed with the end's padding
    assert np.abs(outs[1][:near_cut] - outs[0][:near_cut]).max() <= 1 / 32768


def test_an_output_cut_short_by_a_size_limit_is_an_error_and_not_left(tmp_path: Path, ckpt: str) -> None:
    """FLAC encodes its last frames and its header in close(), where soundfile ignores a failed write: a file
    size limit met there left a cut file behind, with exit 0. Now the output must read back whole."""
    resource = pytest.importorskip("resource")
    src = tmp_path / "in.wav"
    sf.write(src, noisy(4.0, 16000), 16000)
    full = tmp_path / "full.flac"
    assert cli(str(src), "-o", str(full), "--checkpoint", ckpt, "-q").returncode == 0
    size = full.stat().st_size
    for limit in (size - 1, size - 200, size // 2):  # met in close() or while writing: the same outcome

        def cap(limit: int = limit) -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        dst = tmp_path / f"cut{limit}.flac"
        proc = subprocess.run(
            [sys.executable, "-m", "enhance.cli", str(src), "-o", str(dst), "--checkpoint", ckpt, "-q"],
            capture_output=True,
            env=ENV,
            timeout=300,
            preexec_fn=cap,
        )
        assert proc.returncode == 1, proc.stderr.decode()
        assert b"writing the output failed" in proc.stderr
        assert not dst.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_overwrite_keeps_the_permissions_and_writes_through_a_link(tmp_path: Path, ckpt: str) -> None:
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.5, 16000), 16000)
    private = tmp_path / "private.wav"
    private.write_bytes(b"old")
    private.chmod(0o600)
    assert cli(str(src), "-o", str(private), "--checkpoint", ckpt, "--overwrite").returncode == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and sf.info(str(private)).frames == 8000
    target, link = tmp_path / "target.wav", tmp_path / "link.wav"
    target.write_bytes(b"old")
    link.symlink_to(target.name)
    assert cli(str(src), "-o", str(link), "--checkpoint", ckpt, "--overwrite").returncode == 0
    assert link.is_symlink() and sf.info(str(target)).frames == 8000


def test_a_folder_scan_leaves_out_hidden_files(tmp_path: Path, ckpt: str) -> None:
    """macOS leaves "._take.wav" companions (not audio) beside each file on a shared drive: a folder run
    failed on every one of them, exit 1."""
    d = tmp_path / "in"
    d.mkdir()
    sf.write(d / "take.wav", noisy(0.5, 16000), 16000)
    (d / "._take.wav").write_bytes(b"\x00\x05\x16\x07" + b"\x00" * 60)
    proc = cli(str(d), "-o", str(tmp_path / "out"), "--checkpoint", ckpt, "--json")
    assert proc.returncode == 0, proc.stderr.decode()
    assert [Path(f["input"]).name for f in json.loads(proc.stdout)["files"]] == ["take.wav"]


def test_block_codecs_pass_the_read_back_check(tmp_path: Path, ckpt: str) -> None:
    """IMA ADPCM and GSM 6.10 pad their last block: the output reads back a little longer than written, which
    the full-disk check took for a failed write."""
    src = tmp_path / "in.wav"
    sf.write(src, noisy(0.7, 16000), 16000)
    for subtype in ("IMA_ADPCM", "GSM610"):
        dst = tmp_path / f"{subtype}.wav"
        proc = cli(str(src), "-o", str(dst), "--subtype", subtype, "--checkpoint", ckpt, "-q")
        assert proc.returncode == 0, proc.stderr.decode()
        assert sf.info(str(dst)).subtype == subtype and sf.info(str(dst)).frames >= 11200
