"""The product on an accelerator: does ``--device cuda`` give the CPU's samples, and how fast is it?

    python bench/bench_device.py --device cuda --out bench/results/device-cuda.md

Every path a user can put on an accelerator, against the same path on the CPU (the reference), with the bundled
default model (or ``--checkpoint``):

- offline (:func:`enhance.offline.enhance_audio`): ``examples/noisy.wav`` (16 kHz mono), the same at 48 kHz in
  stereo (resampling and the high band), and the competition maps; each with PyTorch's default TF32 setting for
  convolutions on CUDA and with TF32 off, to see what TF32 costs;
- streaming (:class:`enhance.streaming.StreamingEnhancer` with the PyTorch backend on the device, which is what
  ``auto`` picks off the CPU): chunks of 1000 samples and of random sizes, against the offline result;
- ``enhance-cli --device DEVICE`` as a subprocess, file mode and ``--stream``, against ``enhance-cli`` on the CPU
  (the 16-bit files compared in steps of one least significant bit, LSB);
- ``enhance-server --device DEVICE`` as a subprocess: one POST /v1/enhance, eight at once, and a WebSocket
  stream (which runs on ``--stream-device``, the CPU by default), against the CPU CLI's file.

Speed: the offline real-time factor on ``--seconds`` of audio (the device against the CPU with all its cores) and
the streaming engine's time per 16-ms hop, p50/p99 (PyTorch on the device against the CPU's PyTorch and its
fastest backend, one thread). The CPU reference runs on the machine the script runs on, so the ratios are from one
run on one machine. A check fails (exit 1) when a path's difference to the CPU is over ``--max-lsb`` LSB (files)
or under ``--min-snr`` dB (float paths: the CPU output's power over the difference's power).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf
import torch
from bench_server import launch_server  # bench/ is on sys.path when run as a script
from machine import command_line, cpu_summary

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from enhance.backends import streaming_backend  # noqa: E402
from enhance.offline import enhance_audio  # noqa: E402
from enhance.streaming import StreamingEnhancer  # noqa: E402
from models import load_checkpoint  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402

HOP = 256


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    """The reference's power over the difference's, in dB (inf when equal)."""
    err = float(np.sum((np.asarray(ref, np.float64) - np.asarray(x, np.float64)) ** 2))
    return float("inf") if err == 0 else 10 * np.log10(float(np.sum(np.asarray(ref, np.float64) ** 2)) / err)


def lsb(a: np.ndarray, b: np.ndarray) -> int:
    """Largest difference of two 16-bit signals, in LSB."""
    return int(np.max(np.abs(a.astype(np.int32) - b.astype(np.int32)))) if a.size else 0


class Report:
    def __init__(self, min_snr: float, max_lsb: int) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.speed: list[tuple[str, str, str]] = []
        self.notes: list[str] = []
        self.min_snr, self.max_lsb = min_snr, max_lsb
        self.failed = False

    def float_row(self, what: str, ref: np.ndarray, x: np.ndarray) -> None:
        if ref.shape != x.shape:
            self._row(what, f"shape {x.shape} vs {ref.shape}", "", False)
            return
        d = snr_db(ref, x)
        self._row(what, f"{np.max(np.abs(ref - x)):.2e}", f"{d:.1f}", d >= self.min_snr)

    def lsb_row(self, what: str, ref: np.ndarray, x: np.ndarray) -> None:
        if ref.shape != x.shape:
            self._row(what, f"shape {x.shape} vs {ref.shape}", "", False)
            return
        n = lsb(ref, x)
        self._row(what, f"{n} LSB", f"{snr_db(ref / 32768.0, x / 32768.0):.1f}", n <= self.max_lsb)

    def error_row(self, what: str, exc: BaseException) -> None:
        self._row(
            what,
            f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}",
            "",
            False,
        )

    def _row(self, what: str, diff: str, snr: str, ok: bool) -> None:
        self.rows.append((what, diff, snr, "yes" if ok else "**no**"))
        self.failed |= not ok
        print(f"  {what}: {diff} ({snr} dB) {'ok' if ok else 'FAILED'}", flush=True)

    def markdown(self, header: list[str]) -> str:
        out = [
            *header,
            "",
            "| path on the device, against the CPU | largest difference | SNR of the difference (dB) | ok |",
        ]
        out.append("|---|---|---|---|")
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows]
        out += ["", "| speed | device | CPU |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in self.speed]
        if self.notes:
            out += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(out) + "\n"


@contextmanager
def tf32(on: bool) -> Iterator[None]:
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = old


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream(model: Any, wav: np.ndarray, sizes: Callable[[], int], backend: Any = None) -> np.ndarray:
    eng = StreamingEnhancer(model, channels=wav.shape[0], backend=backend)
    out, i = [], 0
    while i < wav.shape[1]:
        n = sizes()
        out.append(eng.process(wav[:, i : i + n]))
        i += n
    out.append(eng.flush())
    return np.concatenate(out, axis=1)


def hop_times(
    model: Any, wav: np.ndarray, device: torch.device, backend: Any = None
) -> tuple[float, float, float]:
    """p50 and p99 ms per 256-sample chunk (one hop), and the real-time factor over the whole stream."""
    eng = StreamingEnhancer(model, backend=backend)
    for i in range(0, 50 * HOP, HOP):  # warm-up
        eng.process(wav[:, i : i + HOP])
    eng.reset()
    times = []
    for i in range(0, wav.shape[1] - HOP + 1, HOP):
        t = time.perf_counter()
        eng.process(wav[:, i : i + HOP])
        sync(device)
        times.append(time.perf_counter() - t)
    ms = 1000 * np.asarray(times)
    return (
        float(np.percentile(ms, 50)),
        float(np.percentile(ms, 99)),
        float(ms.sum() / 1000 / (len(ms) * HOP / 16000)),
    )


def read16(src: Path | io.BytesIO) -> np.ndarray:
    return sf.read(src, dtype="int16", always_2d=True)[0].T


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="the accelerator (default: cuda)")
    ap.add_argument("--checkpoint", help="a checkpoint instead of the bundled default model")
    ap.add_argument("--seconds", type=float, default=600.0, help="audio for the offline speed row")
    ap.add_argument("--hop-seconds", type=float, default=20.0, help="audio for the per-hop rows")
    ap.add_argument(
        "--min-snr", type=float, default=60.0, help="float paths: least SNR of the difference (dB)"
    )
    ap.add_argument("--max-lsb", type=int, default=1, help="16-bit files: largest difference (LSB)")
    ap.add_argument("--no-server", action="store_true", help="skip the enhance-server rows")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/device.md")
    args = ap.parse_args()
    device = torch.device(args.device)
    rep = Report(args.min_snr, args.max_lsb)

    def load(dev: str | torch.device) -> Any:
        ck = load_checkpoint(args.checkpoint, map_location="cpu") if args.checkpoint else load_pretrained()
        return ck.model.to(dev).eval()

    cpu, acc = load("cpu"), load(device)
    torch.set_num_threads(os.cpu_count() or 1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    header = [
        f"# The product on `{args.device}` against the CPU",
        "",
        f"- device: {name}; CPU: {cpu_summary()}; PyTorch {torch.__version__}; {time.strftime('%Y-%m-%d')}",
        f"- model: {args.checkpoint or 'bundled default'}\n- Command: `{command_line()}`",
        f"- TF32 defaults here: matmul {torch.backends.cuda.matmul.allow_tf32}, cuDNN convolutions "
        f"{torch.backends.cudnn.allow_tf32}",
    ]
    print("\n".join(header), flush=True)

    noisy, _ = sf.read(str(ROOT / "examples/noisy.wav"), dtype="float32", always_2d=True)
    x16 = noisy.T.copy()
    import soxr

    x48 = np.stack(
        [soxr.resample(x16[0], 16000, 48000), 0.7 * soxr.resample(x16[0][::-1].copy(), 16000, 48000)]
    )
    x48 = x48.astype(np.float32)

    # ---- offline
    ref16 = enhance_audio(cpu, x16, 16000, return_competition=True)
    ref48 = enhance_audio(cpu, x48, 48000).wav
    for on in (True, False):
        label = "TF32 convolutions on (PyTorch's default)" if on else "TF32 off"
        with tf32(on):
            try:
                got = enhance_audio(acc, x16, 16000, return_competition=True)
                rep.float_row(f"offline, 16 kHz mono, {label}", ref16.wav, got.wav)
                worst = max(
                    float(np.max(np.abs(a - b)))
                    for a, b in zip(ref16.competition or [], got.competition or [], strict=True)
                )
                rep.notes.append(
                    f"competition maps, {label}: largest difference {worst:.2e} (scores in 0..1)"
                )
                rep.float_row(
                    f"offline, 48 kHz stereo (high band), {label}", ref48, enhance_audio(acc, x48, 48000).wav
                )
            except Exception as exc:  # a failing path is a row of the report
                rep.error_row(f"offline, {label}", exc)

    # ---- streaming, PyTorch backend on the device
    try:
        acc_off = enhance_audio(acc, x16, 16000).wav
        rng = np.random.default_rng(0)
        rep.float_row(
            "streaming, chunks of 1000, against the CPU's offline", ref16.wav, stream(acc, x16, lambda: 1000)
        )
        rep.float_row(
            "streaming, random chunks 1-3000, against the device's offline",
            acc_off,
            stream(acc, x16, lambda: int(rng.integers(1, 3001))),
        )
    except Exception as exc:
        rep.error_row("streaming", exc)

    with tempfile.TemporaryDirectory() as tmp:
        tdir = Path(tmp)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        model_args = ["--checkpoint", args.checkpoint] if args.checkpoint else []

        def cli(out: str, *extra: str) -> Path:
            path = tdir / out
            subprocess.run(
                [sys.executable, "-m", "enhance.cli", str(ROOT / "examples/noisy.wav"), "-o", str(path), "-q",
                 *model_args, *extra],
                check=True, env=env, cwd=ROOT, capture_output=True, timeout=300,
            )  # fmt: skip
            return path

        ref_file = read16(cli("cpu.wav", "--device", "cpu"))
        for label, extra in (("file mode", []), ("--stream", ["--stream"])):
            try:
                rep.lsb_row(
                    f"enhance-cli {label}",
                    ref_file,
                    read16(cli(f"acc-{len(extra)}.wav", "--device", args.device, *extra)),
                )
            except subprocess.CalledProcessError as exc:
                rep.error_row(
                    f"enhance-cli {label}", RuntimeError(exc.stderr.decode(errors="replace").strip()[-300:])
                )
            except Exception as exc:
                rep.error_row(f"enhance-cli {label}", exc)
        if not args.no_server:
            server_rows(rep, args, env, model_args, ref_file)

    # ---- speed
    long = np.tile(x16, (1, int(np.ceil(args.seconds * 16000 / x16.shape[1]))))[
        :, : int(args.seconds * 16000)
    ]
    t_acc = {}
    for on in (True, False):  # the product's commands turn TF32 off (enhance.device.inference_device)
        with tf32(on):
            enhance_audio(acc, x16, 16000)  # warm-up
            sync(device)
            t = time.perf_counter()
            enhance_audio(acc, long, 16000)
            sync(device)
            t_acc[on] = time.perf_counter() - t
    t = time.perf_counter()
    enhance_audio(cpu, long, 16000)
    t_cpu = time.perf_counter() - t
    for on in (False, True):
        rep.speed.append(
            (
                f"offline real-time factor, {args.seconds:.0f} s, TF32 {'on' if on else 'off'} "
                f"(CPU: {torch.get_num_threads()} threads)",
                f"{t_acc[on] / args.seconds:.4f}",
                f"{t_cpu / args.seconds:.4f} ({t_cpu / t_acc[on]:.1f}x the device's time)",
            )
        )
        print(f"  {rep.speed[-1]}", flush=True)
    hop = np.tile(x16, (1, int(np.ceil(args.hop_seconds * 16000 / x16.shape[1]))))[
        :, : int(args.hop_seconds * 16000)
    ]
    torch.set_num_threads(1)
    a50, a99, a_rtf = hop_times(acc, hop, device)
    c50, c99, c_rtf = hop_times(cpu, hop, torch.device("cpu"))
    rep.speed.append(
        ("streaming, PyTorch eager, ms per hop p50 / p99 (RTF)", f"{a50:.2f} / {a99:.2f} ({a_rtf:.3f})",
         f"{c50:.2f} / {c99:.2f} ({c_rtf:.3f}), 1 thread")
    )  # fmt: skip
    print(f"  {rep.speed[-1]}", flush=True)
    try:
        backend = streaming_backend(cpu, "auto")
        kind = type(backend).__name__ if backend is not None else "PyTorch"
        b50, b99, b_rtf = hop_times(cpu, hop, torch.device("cpu"), backend)
        rep.speed.append(
            (f"streaming, the CPU's `auto` backend ({kind}), ms per hop p50 / p99 (RTF)", "",
             f"{b50:.2f} / {b99:.2f} ({b_rtf:.3f}), 1 thread")
        )  # fmt: skip
        print(f"  {rep.speed[-1]}", flush=True)
    except Exception as exc:
        rep.notes.append(f"the CPU's auto streaming backend did not run: {exc}")

    text = rep.markdown(header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 1 if rep.failed else 0


def server_rows(
    rep: Report, args: argparse.Namespace, env: dict[str, str], model_args: list[str], ref: np.ndarray
) -> None:
    try:
        proc, url = launch_server(["--device", args.device, *model_args], {"PYTHONPATH": env["PYTHONPATH"]})
    except RuntimeError as exc:  # its own words went to stderr
        rep.error_row("enhance-server", exc)
        return
    try:
        body = (ROOT / "examples/noisy.wav").read_bytes()
        with httpx.Client(base_url=url, timeout=120) as client:

            def post() -> np.ndarray:
                resp = client.post("/v1/enhance", content=body, headers={"Content-Type": "audio/wav"})
                resp.raise_for_status()
                return read16(io.BytesIO(resp.content))

            rep.lsb_row("enhance-server POST /v1/enhance", ref, post())
            with ThreadPoolExecutor(8) as pool:  # httpx.Client is thread-safe
                outs = list(pool.map(lambda _: post(), range(8)))
            worst = max(outs, key=lambda o: lsb(ref, o) if o.shape == ref.shape else 1 << 30)
            rep.lsb_row("enhance-server, 8 POSTs at once (the worst)", ref, worst)
            info = client.get("/v1/models").json()["models"][0]
        rep.notes.append(
            f"enhance-server --device {args.device}: streams run on {info['stream_device']} with the "
            f"{info['stream_backend']} backend (/v1/models)"
        )
        ws = url.replace("http://", "ws://")
        rep.lsb_row("enhance-server WS /v1/stream (20-ms messages)", ref, ws_stream(ws, body))
    except Exception as exc:
        rep.error_row("enhance-server", exc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def ws_stream(ws_url: str, wav_file: bytes) -> np.ndarray:
    from websockets.sync.client import connect

    pcm = sf.read(io.BytesIO(wav_file), dtype="int16")[0].astype("<i2").tobytes()
    out = []
    with connect(f"{ws_url}/v1/stream", open_timeout=30) as ws:
        ws.send(json.dumps({"sample_rate": 16000, "channels": 1, "format": "s16le"}))
        ready = json.loads(ws.recv(timeout=60))
        if ready.get("type") != "ready":
            raise RuntimeError(f"stream not started: {ready}")
        step = 2 * 320  # 20 ms
        for i in range(0, len(pcm), step):
            ws.send(pcm[i : i + step])
        ws.send(json.dumps({"type": "end"}))
        while True:
            msg = ws.recv(timeout=60)
            if isinstance(msg, str):
                break
            out.append(msg)
    return np.frombuffer(b"".join(out), "<i2")[None, :]


if __name__ == "__main__":
    sys.exit(main())
