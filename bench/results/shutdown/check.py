"""enhance-server stopped by SIGINT and by SIGTERM with a WebSocket stream open mid-audio: how much of its audio
came back, its last message and close code, and the process' exit status (the README's "Running it for others").

    python bench/results/shutdown/check.py     # from the repository root; writes check.txt beside this file
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from bench_server import launch_server


def stop_with(sig: signal.Signals) -> str:
    server, url = launch_server(["--threads", "1"])
    with connect(url.replace("http", "ws", 1) + "/v1/stream") as ws:
        ws.send(json.dumps({}))
        ws.recv(timeout=20)
        ws.send(bytes(32000))  # 1 s of s16le at 16 kHz
        time.sleep(1)
        server.send_signal(sig)
        samples, last = 0, "no message"
        try:
            while True:
                msg = ws.recv(timeout=20)
                if isinstance(msg, bytes):
                    samples += len(msg) // 2
                else:
                    last = json.loads(msg).get("code", msg)
        except ConnectionClosed:
            pass
        return (
            f"{sig.name}: {samples} of 16000 samples back, then {last}; stream closed with {ws.close_code}, "
            f"server exit status {server.wait(40)}"
        )


def main() -> None:
    text = "\n".join(stop_with(sig) for sig in (signal.SIGINT, signal.SIGTERM)) + "\n"
    print(text, end="")
    (Path(__file__).resolve().parent / "check.txt").write_text(text)


if __name__ == "__main__":
    main()
