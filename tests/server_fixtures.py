"""Helpers for the server tests: a tiny checkpoint, a real uvicorn server in a thread, test audio."""

from __future__ import annotations

import io
import queue
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf
import torch
import uvicorn

from models import Enhancer, get_config, save_checkpoint
from server.app import create_app
from server.config import UVICORN_WS, ServerConfig
from server.drain import DrainingServer
from server.registry import LoadedModel, Loader, load_models
from tests.conftest import speech_like


def tiny_checkpoint(path: Path) -> Path:
    torch.manual_seed(0)
    save_checkpoint(path, Enhancer(get_config("tiny")), "tiny")
    return path


def noisy(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 0) -> np.ndarray:
    """[samples, channels] float32: speech-like signal plus white noise."""
    rng = np.random.default_rng(seed)
    cols = [speech_like(seconds, rate, seed=seed + c) for c in range(channels)]
    x = np.stack(cols, axis=1)
    return (x + 0.02 * rng.standard_normal(x.shape)).astype(np.float32)


def wav_bytes(x: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class RunningServer:
    def __init__(self, app: Any, server: uvicorn.Server, port: int) -> None:
        self.app, self.server, self.port = app, server, port
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0, **kwargs)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while time.monotonic() < deadline:
                if c.get("/readyz").status_code == 200:
                    return
                time.sleep(0.05)
        raise TimeoutError("server did not become ready")


@contextmanager
def run_server(
    config: ServerConfig, *, loader: Loader | None = None, wait_ready: bool = True, **uvicorn_options: Any
) -> Iterator[RunningServer]:
    """A real uvicorn server on 127.0.0.1 (free port) in a background thread, with enhance-server's WebSocket
    settings (``uvicorn_options`` may override them) and shutdown (:class:`server.drain.DrainingServer`)."""
    app = create_app(config, loader=loader)
    sock = free_socket()
    port = sock.getsockname()[1]
    options = {**UVICORN_WS, **uvicorn_options}
    server = DrainingServer(
        uvicorn.Config(app, log_level="warning", lifespan="on", **options), app.state.stream_drain
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    running = RunningServer(app, server, port)
    try:
        if wait_ready:
            running.wait_ready()
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


RUNNING = re.compile(r"Uvicorn running on (http://\S+)")


class ServerProcess:
    """``enhance-server`` as a subprocess on a port the OS picks (``--port 0``; choosing a free port here and
    passing it raced anything else binding one), its URL read from uvicorn's "running on" line (hence
    ``--log-level info``); stderr is drained in a thread (a full pipe would stall the server)."""

    def __init__(self, cmd: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(
            [*cmd, "--port", "0", "--log-level", "info"], stderr=subprocess.PIPE, text=True, **popen
        )
        self.lines: list[str] = []
        self._url: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if found := RUNNING.search(line):
                self._url.put(found.group(1))
        self._url.put(None)

    def url(self, timeout: float = 60.0) -> str:
        """The server's base URL, once it listens."""
        try:
            url = self._url.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("enhance-server did not start listening:\n" + self.stderr()) from None
        if url is None:
            raise RuntimeError(
                f"enhance-server exited ({self.proc.poll()}) before listening:\n" + self.stderr()
            )
        return url

    def stderr(self) -> str:
        """What the server wrote to stderr so far (all of it, once the process has ended)."""
        if self.proc.poll() is not None:
            self._reader.join(timeout=10)
        return "".join(self.lines)


def gated_loader(gate: threading.Event) -> Loader:
    """Loads the models for real, but every model step first waits for ``gate``: a request holds its slot for as
    long as the test wants (no guessing how long an enhancement takes)."""

    def load(config: ServerConfig) -> dict[str, LoadedModel]:
        models = load_models(config)
        for lm in models.values():
            model, step = lm.checkpoint.model, lm.checkpoint.model.step

            def gated_step(*args: Any, _step: Any = step, **kwargs: Any) -> Any:
                if not gate.wait(60):
                    raise RuntimeError("the test never opened the gate")
                return _step(*args, **kwargs)

            model.step = gated_step  # type: ignore[method-assign]
        return models

    return load
