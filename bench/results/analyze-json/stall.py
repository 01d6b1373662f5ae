"""How long /v1/analyze's JSON encoding stalls the server's event loop: a body shaped as a 10-minute file's
analysis (37,500 frames; 5 TIM blocks of 2 mechanisms, rounded to 4 digits as server.work does), encoded in a
worker thread by ``JSONResponse`` (one json.dumps: holds the GIL throughout) and by ``server.json_text.json_bytes``
(pieces of 1000 rows), while a task on the loop sleeps 1 ms at a time and records how late it wakes.

    PYTHONPATH=. python bench/results/analyze-json/stall.py     # writes stall.txt beside this file
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread
import numpy as np
from starlette.responses import JSONResponse

from server.json_text import json_bytes

FRAMES = 37_500  # 600 s at a 16-ms hop


def body() -> dict:
    rng = np.random.default_rng(0)
    blocks = []
    for block in range(3, 8):
        p = rng.random((FRAMES, 1))
        blocks.append(
            {"block": block, "maps": np.round(np.hstack([p, 1 - p]), 4).tolist(), "mean_entropy": 0.6}
        )
    times = [round(float(t), 4) for t in np.arange(FRAMES) * 0.016]
    return {"model": "default", "frame_times": times, "blocks": blocks}


async def longest_stall(encode: Callable[[], bytes]) -> tuple[float, float, int]:
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    t0 = time.perf_counter()
    size = len(await anyio.to_thread.run_sync(encode))
    took = time.perf_counter() - t0
    await asyncio.sleep(0.02)
    stop.set()
    await task
    return took, max(lags), size


def main() -> None:
    b = body()
    assert json_bytes(b) == JSONResponse(b).body
    lines = [
        "| encoder (in a worker thread) | run | encoding (ms) | longest event-loop stall (ms) | bytes |",
        "|---|---|---|---|---|",
    ]
    for run in (1, 2, 3):
        for name, encode in (
            ("JSONResponse(body).body", lambda: bytes(JSONResponse(b).body)),
            ("json_bytes(body)", lambda: json_bytes(b)),
        ):
            took, stall, size = asyncio.run(longest_stall(encode))
            lines.append(f"| {name} | {run} | {took * 1000:.0f} | {stall * 1000:.1f} | {size} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (Path(__file__).resolve().parent / "stall.txt").write_text(text)


if __name__ == "__main__":
    main()
