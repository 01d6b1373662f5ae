"""Peak memory of one upload that is read in full and then refused (422: not audio), raw and multipart.

    python bench/results/upload-memory/probe.py [MiB]   # default 45; writes probe.txt beside this file

Starts enhance-server (one thread; bench_server.launch_server), warms it with a small request, and reads the process' peak
resident memory (VmHWM) before and after each upload. A fresh server per kind, so each peak is that upload's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # bench/

from bench_server import launch_server  # noqa: E402


def hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def run(kind: str, mib: int) -> tuple[float, float, int]:
    server, url = launch_server(["--threads", "1", "--max-upload-mb", "60"])
    try:
        httpx.post(
            f"{url}/v1/enhance", content=b"x" * 1000, headers={"Content-Type": "audio/wav"}, timeout=60
        )
        before = hwm_mib(server.pid)
        body = bytes(mib << 20)  # zeros: read in full, then not a readable audio file
        if kind == "raw":
            resp = httpx.post(
                f"{url}/v1/enhance", content=body, headers={"Content-Type": "audio/wav"}, timeout=120
            )
        else:
            resp = httpx.post(f"{url}/v1/enhance", files={"file": ("x.wav", body, "audio/wav")}, timeout=120)
        return before, hwm_mib(server.pid), resp.status_code
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 45
    lines = [f"upload of {mib} MiB, peak resident memory (VmHWM) of enhance-server before and after", ""]
    lines.append("| body | before (MiB) | after (MiB) | added (MiB) | added / upload | status |")
    lines.append("|---|---|---|---|---|---|")
    for kind in ("raw", "multipart"):
        before, after, status = run(kind, mib)
        lines.append(
            f"| {kind} | {before:.0f} | {after:.0f} | {after - before:.0f} | {(after - before) / mib:.2f} | {status} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "probe.txt").write_text(text)


if __name__ == "__main__":
    main()
