"""enhance-server stopped by SIGINT and by SIGTERM with a WebSocket stream open mid-audio: the stream's close code
and the process' exit status (the README's "Running it for others").

    python bench/results/shutdown/check.py     # from the repository root; writes check.txt beside this file
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

PORT = 18656


def stop_with(sig: signal.Signals) -> str:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.main",
            "--port",
            str(PORT),
            "--threads",
            "1",
            "--log-level",
            "warning",
        ],
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/readyz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    with connect(f"ws://127.0.0.1:{PORT}/v1/stream") as ws:
        ws.send(json.dumps({}))
        ws.recv(timeout=20)
        ws.send(bytes(32000))  # 1 s of s16le at 16 kHz
        time.sleep(1)
        server.send_signal(sig)
        try:
            while True:
                ws.recv(timeout=20)
        except ConnectionClosed:
            pass
        return f"{sig.name}: stream closed with {ws.close_code}, server exit status {server.wait(40)}"


def main() -> None:
    text = "\n".join(stop_with(sig) for sig in (signal.SIGINT, signal.SIGTERM)) + "\n"
    print(text, end="")
    (Path(__file__).resolve().parent / "check.txt").write_text(text)


if __name__ == "__main__":
    main()
