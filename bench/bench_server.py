"""Loopback load test of the HTTP/WebSocket service (``enhance-server``).

    python bench/bench_server.py [--model default | --checkpoint PATH | --url URL]
                                 [--clients 16] [--seconds 60] [--audio-seconds 4]
                                 [--streams 4] [--stream-seconds 30] [--max-concurrency 2] [--max-queue 16]
                                 [--queue-timeout 10] [--threads 0] [--note TEXT]

1. HTTP: ``--clients`` concurrent clients post a ``--audio-seconds`` WAV (speech-like sound plus noise, 16 kHz
   mono, PCM_16) to ``POST /v1/enhance`` in a loop for ``--seconds``. A client that gets 503 waits the
   Retry-After the server asks for, as a well-behaved client would. Reported: completed requests per second,
   audio seconds enhanced per second, p50/p99 latency of the successful requests (queueing included),
   responses by status, and the server's resident memory (VmRSS) before, at half time and after, plus its peak
   (VmHWM): growth from half time to the end, once every buffer has been used, would be a leak.
2. WebSocket: ``--streams`` concurrent streams each send 20-ms frames of s16le PCM at 1x real-time pace for
   ``--stream-seconds``, as a live source would (a frame goes out once its last sample has been "captured", at
   1x real time). For every enhanced frame received, the lag is its arrival time minus the time the input sample
   at the position of its last sample was captured: capture to output, the frame's wait to fill and the engine's delay included (up to
   session 20 it was timed from the frame's sending, which left the wait out: a p50 below the engine's own
   delay). A stream *kept up* when its p99 lag stayed under ``--max-lag-ms`` (default: the engine's 48 ms +
   200 ms) and every sample came back.

The server is started here as a subprocess (``python -m server.main`` on a free loopback port) unless ``--url``
points at a running one (then its memory is not reported). Prints a Markdown table and writes
``bench/results/server.md`` (``--out``). Needs the ``serve`` extra plus httpx and websockets.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
from sigterm import exit_on_sigterm  # bench/sigterm.py (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's modules (bench/ is on sys.path when run as a script)
RATE = 16000
FRAME_S = 0.02


def test_signal(seconds: float, rate: int = RATE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    voiced = sum(
        np.sin(2 * np.pi * 140 * k * t * (1 + 0.05 * np.sin(2 * np.pi * 0.5 * t))) / k for k in range(1, 10)
    )
    env = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) ** 2
    return (0.05 * voiced * env + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def wav_bytes(x: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def memory(pid: int | None) -> dict[str, int]:
    """VmRSS and VmHWM of a process in bytes (Linux)."""
    out: dict[str, int] = {}
    if pid is None:
        return out
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# ---------- the server ----------


RUNNING = re.compile(r"Uvicorn running on (http://\S+)")


def launch_server(flags: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``python -m server.main`` on a port of 127.0.0.1 the OS picks (``--port 0``: its URL is read from the
    server's "running on" line), once /readyz answers 200; returns the process and its URL. Raises RuntimeError
    when it exits or is not ready in 180 s. The server's log is kept from the console (request lines would
    interleave with the bench's output) and printed if it fails to start."""
    cmd = [sys.executable, "-m", "server.main", "--port", "0", "--log-level", "info", *flags]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "ENHANCE_API_KEY": "", **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C stops it as from a terminal (a background job's child inherits SIGINT ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    found: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:  # all of stderr, or the server stalls on a full pipe
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if match := RUNNING.search(line):
                found.put(match.group(1))
        found.put(None)

    threading.Thread(target=drain, daemon=True).start()

    def failed(why: str) -> RuntimeError:
        proc.kill()
        return RuntimeError(f"{why}; its log:\n{''.join(lines[-40:])}")

    deadline = time.monotonic() + 180
    try:
        url = found.get(timeout=180)
    except queue.Empty:
        raise failed("the server did not start listening in 180 s") from None
    if url is None:
        raise failed(f"the server exited with status {proc.wait()}")
    with httpx.Client(base_url=url, timeout=5) as c:
        while c.get("/readyz").status_code != 200:
            if proc.poll() is not None:
                raise failed(f"the server exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                raise failed("the server did not become ready in 180 s")
            time.sleep(0.2)
    return proc, url


def absolute_checkpoint(spec: str) -> str:
    """``[ALIAS=]PATH`` with PATH made absolute: the server runs in the repository root, where a path relative
    to the caller's folder named no file (or another one)."""
    from server.registry import split_alias  # (here: it loads torch, which the load clients need not)

    alias, path = split_alias(spec)
    return f"{alias}={os.path.abspath(path)}" if alias else os.path.abspath(path)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    flags = (
        ["--checkpoint", absolute_checkpoint(args.checkpoint)] if args.checkpoint else ["--model", args.model]
    )
    flags += ["--max-concurrency", str(args.max_concurrency), "--threads", str(args.threads)]
    flags += ["--max-queue", str(args.max_queue), "--queue-timeout", str(args.queue_timeout)]
    flags += [
        "--max-streams",
        str(max(args.streams, 1)),
        "--max-duration",
        str(max(600.0, args.audio_seconds)),
    ]
    flags += ["--stream-backend", args.stream_backend]
    try:
        return launch_server(flags)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


# ---------- HTTP load ----------


@dataclass
class HttpResult:
    latencies: list[float] = field(default_factory=list)  # successful requests
    statuses: Counter[str] = field(default_factory=Counter)
    audio_seconds: float = 0.0
    wall: float = 0.0
    rss_half: int | None = None  # the server's VmRSS at half time


async def http_load(
    url: str, body: bytes, audio_s: float, clients: int, seconds: float, pid: int | None = None
) -> HttpResult:
    result = HttpResult()
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        t_end = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                try:
                    resp = await client.post(
                        "/v1/enhance", content=body, headers={"Content-Type": "audio/wav"}
                    )
                except httpx.HTTPError as exc:
                    result.statuses[type(exc).__name__] += 1
                    continue
                result.statuses[str(resp.status_code)] += 1
                if resp.status_code == 200:
                    result.latencies.append(time.perf_counter() - t0)
                    result.audio_seconds += audio_s
                elif resp.status_code == 503:
                    wait = float(resp.headers.get("Retry-After", "1"))
                    await asyncio.sleep(min(wait, max(0.0, t_end - time.perf_counter())))

        async def half_time_memory() -> None:
            await asyncio.sleep(seconds / 2)
            result.rss_half = memory(pid).get("VmRSS")

        t0 = time.perf_counter()
        await asyncio.gather(half_time_memory(), *(worker() for _ in range(clients)))
        result.wall = time.perf_counter() - t0
    return result


# ---------- WebSocket streams ----------


@dataclass
class StreamResult:
    lags: list[float] = field(default_factory=list)
    received: int = 0
    sent: int = 0
    error: str | None = None
    latency_ms: float = 0.0


async def one_stream(ws_url: str, seconds: float, seed: int) -> StreamResult:
    from websockets.asyncio.client import connect

    res = StreamResult()
    x = test_signal(seconds, seed=seed)
    pcm = np.clip(np.round(x * 32768), -32768, 32767).astype("<i2")
    frame = int(FRAME_S * RATE)
    sent_at: list[float] = []
    start: list[float] = []  # when the stream's first sample was "captured" (the sender's clock origin)
    try:
        async with connect(f"{ws_url}/v1/stream", max_size=None, open_timeout=60) as ws:
            await ws.send(json.dumps({"sample_rate": RATE, "channels": 1, "format": "s16le"}))
            ready = json.loads(await ws.recv())
            if ready.get("type") != "ready":
                res.error = str(ready.get("error", ready))
                return res
            res.latency_ms = float(ready["latency_ms"])

            async def sender() -> None:
                # as a live source: sample s is captured at t0 + s / RATE, and a frame is sent once its last
                # sample is (frame k at t0 + (k + 1) x FRAME_S)
                t0 = time.perf_counter()
                start.append(t0)
                for k, i in enumerate(range(0, len(pcm), frame)):
                    delay = t0 + (k + 1) * FRAME_S - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    chunk = pcm[i : i + frame]
                    await ws.send(chunk.tobytes())
                    sent_at.append(time.perf_counter())
                    res.sent += len(chunk)
                await ws.send(json.dumps({"type": "end"}))

            async def receiver() -> None:
                while True:
                    msg = await ws.recv()
                    now = time.perf_counter()
                    if isinstance(msg, str):
                        info = json.loads(msg)
                        if info.get("type") != "done":
                            res.error = str(info.get("error", info))
                        return
                    res.received += len(msg) // 2
                    last = res.received - 1
                    if last // frame < len(sent_at) and res.received <= res.sent:
                        # capture to output: from when the newest sample received was captured (the frame's
                        # wait to fill and the engine's 32-48 ms delay included); timing from the frame's send
                        # left out the wait for the frame to fill, so a p50 came out below the engine's delay
                        res.lags.append(now - (start[0] + (last + 1) / RATE))

            await asyncio.gather(sender(), receiver())
    except Exception as exc:  # a benchmark reports failures, it does not stop on them
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def streams_load(ws_url: str, n: int, seconds: float) -> list[StreamResult]:
    return list(await asyncio.gather(*(one_stream(ws_url, seconds, seed=i) for i in range(n))))


# ---------- report ----------


def report(args: argparse.Namespace, http: HttpResult | None, streams: list[StreamResult], mem: dict) -> str:
    lines = [
        "# Server load test (loopback)",
        "",
        f"`{shlex.join(['python', 'bench/bench_server.py', *sys.argv[1:]])}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}; "
        f"model: {args.checkpoint or args.model}; server max concurrency {args.max_concurrency}, wait queue "
        f"{args.max_queue} requests / {args.queue_timeout:g} s, torch threads {args.threads or 'default'}, stream backend {args.stream_backend}. "
        f"Clients and server share the machine; 1-min load average before the run: {args.load_before:.2f}, "
        f"at its end (its own load included): {args.load_after:.2f}. Anything else running competes for the "
        "same cores.",
        "",
    ]
    if args.note:
        lines += [f"Note: {args.note}", ""]
    if http is not None:
        ok = len(http.latencies)
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(http.statuses.items())) or "none"
        lines += [
            f"## HTTP: {args.clients} clients x {args.seconds:g} s, POST /v1/enhance with {args.audio_seconds:g} s WAV",
            "",
            "| completed req/s | audio s enhanced / s | p50 latency (s) | p99 latency (s) | responses by status |"
            " RSS before (MiB) | RSS at half time (MiB) | RSS after (MiB) | peak RSS (MiB) |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {ok / http.wall:.2f} | {http.audio_seconds / http.wall:.2f} | {percentile(http.latencies, 50):.3f} "
            f"| {percentile(http.latencies, 99):.3f} | {statuses} | {_mib(mem.get('before'))} "
            f"| {_mib(http.rss_half)} | {_mib(mem.get('after'))} | {_mib(mem.get('peak'))} |",
            "",
        ]
    if streams:
        limit = args.max_lag_ms if args.max_lag_ms else streams[0].latency_ms + 200.0
        lines += [
            f"## WebSocket: {len(streams)} streams x {args.stream_seconds:g} s at 1x real time (20-ms s16le frames)",
            "",
            f"Kept up: p99 lag below {limit:.0f} ms and every sample returned. Lag = arrival of an enhanced frame "
            "minus the capture of the input sample at the position of its last sample (frames sent once full, at 1x "
            "real time): capture to output, the 20-ms frame's wait to fill and the engine's algorithmic delay "
            "included.",
            "",
            "| stream | samples sent | samples back | p50 lag (ms) | p99 lag (ms) | max lag (ms) | kept up | error |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for i, s in enumerate(streams):
            p99 = 1000 * percentile(s.lags, 99)
            kept = s.error is None and s.received == s.sent and p99 <= limit
            lines.append(
                f"| {i} | {s.sent} | {s.received} | {1000 * percentile(s.lags, 50):.1f} | {p99:.1f} "
                f"| {1000 * max(s.lags, default=float('nan')):.1f} | {'yes' if kept else 'no'} | {s.error or ''} |"
            )
        lines.append("")
    return "\n".join(lines)


def _mib(value: int | None) -> str:
    return f"{value / 2**20:.0f}" if value else "n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default", help="bundled model the server loads")
    p.add_argument("--checkpoint", default=None, help="checkpoint file the server loads instead")
    p.add_argument("--url", default=None, help="test a running server instead of starting one")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0, help="HTTP test duration (0: skip)")
    p.add_argument("--audio-seconds", type=float, default=4.0, help="length of the posted WAV")
    p.add_argument("--streams", type=int, default=4, help="concurrent WebSocket streams (0: skip)")
    p.add_argument("--stream-seconds", type=float, default=30.0)
    p.add_argument(
        "--stream-backend", default="auto", help="passed to the server it starts (default: %(default)s)"
    )
    p.add_argument("--max-lag-ms", type=float, default=None, help="kept-up threshold (default latency + 200)")
    p.add_argument("--max-concurrency", type=int, default=2, help="passed to the server it starts")
    p.add_argument("--max-queue", type=int, default=16, help="passed to the server it starts")
    p.add_argument("--queue-timeout", type=float, default=10.0, help="passed to the server it starts (s)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads of the server it starts (0: default)"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "server.md")
    p.add_argument(
        "--note", default="", help="a line added to the report (e.g. what else ran on the machine)"
    )
    args = p.parse_args(argv)
    args.load_before = os.getloadavg()[0]

    exit_on_sigterm()  # the server it started is stopped (it kept listening after a kill)
    proc: subprocess.Popen[str] | None = None
    mem: dict[str, int | None] = {}
    try:
        proc, url = (None, args.url) if args.url else start_server(args)
        pid = proc.pid if proc is not None else None
        http = None
        if args.seconds > 0 and args.clients > 0:
            body = wav_bytes(test_signal(args.audio_seconds))
            with httpx.Client(base_url=url, timeout=600) as c:  # warm-up
                c.post("/v1/enhance", content=body, headers={"Content-Type": "audio/wav"})
            mem["before"] = memory(pid).get("VmRSS")
            http = asyncio.run(http_load(url, body, args.audio_seconds, args.clients, args.seconds, pid))
            mem["after"] = memory(pid).get("VmRSS")
        streams: list[StreamResult] = []
        if args.streams > 0 and args.stream_seconds > 0:
            ws_url = "ws" + url[len("http") :]
            streams = asyncio.run(streams_load(ws_url, args.streams, args.stream_seconds))
        mem["peak"] = memory(pid).get("VmHWM")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    args.load_after = os.getloadavg()[0]
    text = report(args, http, streams, mem)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from recipes.run_folder import write_text

    write_text(args.out, text)  # atomically: a run stopped while writing leaves the committed table whole
    return 0


if __name__ == "__main__":
    sys.exit(main())
