"""``enhance-server``: run the HTTP/WebSocket service with uvicorn.

enhance-server --host 127.0.0.1 --port 8000                       # the bundled default model
enhance-server --checkpoint runs/tim/best.safetensors             # a checkpoint file (its stored name)
enhance-server --model default --checkpoint fast=tiny.safetensors # two models; clients pick with ?model=
ENHANCE_API_KEY=secret enhance-server --host 0.0.0.0              # require X-API-Key / Bearer on /v1/*
"""

from __future__ import annotations

import enhance.wait_policy  # noqa: F401  (first: OpenMP reads its waiting policy when torch loads it)

# isort: split
import argparse
import logging
import math
import os
import signal
import sys
import urllib.parse

from enhance.arguments import bounded, package_version
from enhance.audio_io import MAX_CHANNELS
from enhance.backends import BACKENDS, REDUCED_PRECISION
from enhance.device import inference_device
from models import CheckpointError
from server.config import MB, PROBE_ROOM, UVICORN_WS, ServerConfig


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def port_number(text: str) -> int:
    """``--port``: 0-65535 (uvicorn raised OverflowError from bind() with a traceback)."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535, got {text}")
    return value


# durations and timeouts (s): above 0, at most a year (1e305 passed, then overflowed a stream's sample count: every
# stream an internal error)
SECONDS = bounded(float, 0, above=True, high=365 * 24 * 3600)


def cors_origin(text: str) -> str:
    """An origin as browsers send it: ``scheme://host[:port]``, lower case, no path ("https://app.example.com/"
    and "https://APP.example.com" were taken as given and then matched no browser's Origin); or ``*``."""
    if text == "*":
        return text
    parts = urllib.parse.urlsplit(text.strip())
    scheme_and_host = parts.scheme.lower() in ("http", "https") and parts.netloc and "@" not in parts.netloc
    if not scheme_and_host or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"expected scheme://host[:port] (an origin, no path) or '*', got {text!r}"
        )
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


UPLOAD_MB = bounded(float, 0.001, high=1e6)  # 1e-9 MiB made a limit of 0 bytes


def build_parser() -> argparse.ArgumentParser:
    D = ServerConfig()  # the defaults, written once
    p = argparse.ArgumentParser(
        prog="enhance-server",
        description="Speech enhancement service: POST /v1/enhance, POST /v1/analyze, WS /v1/stream, web page at /.",
        formatter_class=_Formatter,
        epilog=__doc__,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all interfaces)")
    p.add_argument(
        "--port",
        type=port_number,
        default=8000,
        help="TCP port (0: any free one, named in the log's 'Uvicorn running on' line at --log-level info)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="bundled model to serve (repeatable; 'default' when neither --model nor --checkpoint is given)",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=argparse.SUPPRESS,
        metavar="[ALIAS=]PATH",
        help="checkpoint file to serve, under its stored name or ALIAS (repeatable)",
    )
    p.add_argument("--device", default=D.device, help="torch device of the models")
    p.add_argument(
        "--max-upload-mb",
        type=UPLOAD_MB,
        default=D.max_upload_bytes / MB,
        help="largest accepted upload (MiB)",
    )
    p.add_argument("--max-duration", type=SECONDS, default=D.max_duration_s, help="longest accepted file (s)")
    p.add_argument(
        "--max-channels",
        type=bounded(int, 1, high=MAX_CHANNELS),
        default=D.max_channels,
        help="most channels in a file or a stream (default %(default)s)",
    )
    p.add_argument(
        "--max-samples",
        type=bounded(float, 1, high=1e12),
        default=float(D.max_samples),
        help="most samples (frames x channels) in one file, e.g. 80e6: 10 min of 48 kHz stereo is 57.6e6",
    )
    p.add_argument(
        "--max-concurrency",
        type=bounded(int, 1),
        default=D.max_concurrency,
        help="enhancements at once (more wait)",
    )
    p.add_argument(
        "--max-queue",
        type=bounded(int, 0),
        default=D.max_queue,
        help="requests waiting for a slot (more get 503; 0: no queue)",
    )
    p.add_argument(
        "--queue-timeout",
        type=bounded(float, 0),
        default=D.queue_timeout_s,
        help="longest wait for a slot (s), then 503",
    )
    p.add_argument(
        "--timeout",
        type=SECONDS,
        default=D.request_timeout_s,
        help="per-request processing limit (s), then 504",
    )
    p.add_argument(
        "--upload-timeout",
        type=SECONDS,
        default=D.upload_timeout_s,
        help="time to receive an upload (s), then 408",
    )
    p.add_argument(
        "--max-streams", type=bounded(int, 0), default=D.max_streams, help="WebSocket streams at once"
    )
    p.add_argument(
        "--max-stream-seconds",
        type=SECONDS,
        default=D.max_stream_s,
        help="audio per WebSocket stream (s); a stream stays open at most this plus --stream-idle-timeout",
    )
    p.add_argument(
        "--stream-backend",
        choices=BACKENDS,
        default=D.stream_backend,
        help="what runs WebSocket streams' 16 ms steps (auto: native, the step in C, where a C compiler is (or a "
        f"build is cached), else torchscript on a CPU, else pytorch; {REDUCED_PRECISION})",
    )
    p.add_argument(
        "--stream-device",
        default=D.stream_device,
        help="torch device of WebSocket streams (default: %(default)s, also with --device cuda: a 16 ms step is "
        "too little work for a GPU; the CPU's C step was 4x faster than an H200 in bench/results/device-cuda.md)",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=SECONDS,
        default=D.stream_idle_timeout_s,
        help="close a stream when the client sent nothing and the server had none of its audio to enhance for this long (s)",
    )
    p.add_argument(
        "--api-key-env",
        default="ENHANCE_API_KEY",
        metavar="VAR",
        help="environment variable holding the API key; unset or empty: no key required",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        type=cors_origin,
        default=[],
        metavar="ORIGIN",
        help="allowed CORS origin (repeatable; '*': any); also the origins whose pages may open WS /v1/stream "
        "besides the server's own",
    )
    p.add_argument(
        "--threads", type=bounded(int, 0), default=D.threads, help="torch threads (0: torch's default)"
    )
    p.add_argument(
        "--limit-concurrency",
        type=bounded(int, 1),
        default=64,  # ServerConfig's None (no limit) is for embedding the app; a server on a port has one
        help="HTTP requests and WebSocket streams at once before 503 busy (streams: error busy, close 1013); /healthz, /readyz "
        f"and /metrics pass beyond it (uvicorn itself takes {PROBE_ROOM} more connections, idle ones included, for "
        "them); bounds the memory that uploads being read can hold (each about 2.2x its size while a raw body is "
        "read, 3.2x while a multipart one is parsed: bench/results/upload-memory/probe.txt)",
    )
    p.add_argument(
        "--graceful-timeout",
        type=SECONDS,
        default=25.0,
        help="on SIGTERM or Ctrl-C, wait at most this long (s) for running requests before closing them (below "
        "Kubernetes' 30-s grace period; a slow upload or a long job held the exit for minutes)",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--version", action="version", version=f"enhance-server {package_version()}")
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(
        models=tuple(getattr(args, "model", ())),
        checkpoints=tuple(getattr(args, "checkpoint", ())),
        device=args.device,
        max_upload_bytes=int(args.max_upload_mb * MB),
        max_duration_s=args.max_duration,
        max_channels=args.max_channels,
        max_samples=int(args.max_samples),
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout,
        request_timeout_s=args.timeout,
        upload_timeout_s=args.upload_timeout,
        max_streams=args.max_streams,
        max_stream_s=args.max_stream_seconds,
        stream_idle_timeout_s=args.stream_idle_timeout,
        stream_backend=args.stream_backend,
        stream_device=args.stream_device,
        api_key=os.environ.get(args.api_key_env) or None,
        cors_origins=tuple(getattr(args, "cors_origin", ())),
        threads=args.threads,
        limit_concurrency=args.limit_concurrency,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"enhance-server: {exc}", file=sys.stderr)
        return 2
    try:
        from server.app import create_app
        from server.drain import serve
        from server.registry import check_config
    except ImportError as exc:
        print(f"enhance-server: {exc}; install the extra: pip install 'tim-enhance[serve]'", file=sys.stderr)
        return 2
    try:
        inference_device(config.device)
        inference_device(config.stream_device, "--stream-device")
        check_config(config)  # fail now, not in the background, for a missing model or file
    except (CheckpointError, ValueError) as exc:
        print(f"enhance-server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("server")
    if config.api_key is None:
        exposed = args.host not in ("127.0.0.1", "localhost", "::1")
        (log.warning if exposed else log.info)(
            "no API key (%s is unset or empty): /v1/* is open to anyone who can reach %s",
            args.api_key_env,
            # --port 0: uvicorn's "running on" line names the port the OS gave
            f"{args.host}:{args.port}" if args.port else args.host,
        )
    else:
        log.info("API key required on /v1/* (from %s)", args.api_key_env)
    # SIGHUP (the terminal or ssh session went away) killed the process at once, requests included: it shuts
    # down as SIGTERM does (under nohup it stays ignored)
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:
        signal.signal(hangup, lambda signum, frame: os.kill(os.getpid(), signal.SIGTERM))
    app = create_app(config)
    serve(  # uvicorn.run, with open streams sending back their audio before the shutdown closes them
        app,
        app.state.stream_drain,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # the app's own limit (config.limit_concurrency) leaves these PROBE_ROOM connections to the probes
        limit_concurrency=args.limit_concurrency + PROBE_ROOM,
        timeout_graceful_shutdown=math.ceil(args.graceful_timeout),
        proxy_headers=False,
        **UVICORN_WS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
