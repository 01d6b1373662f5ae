"""The processor line every timing benchmark prints in its header.

Timings here moved by 2x between sessions on what reported itself as the same "x86_64, 2 CPUs" VM: the hosts
differed (session 19 ran on an AMD EPYC with AVX2 and no AVX-512), and the native C step is built with
``-march=native``, so its speed follows the vector extensions. The header now names the model and those
extensions, so tables from different hosts are not compared by mistake.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path

# the vector extensions that decide the speed of the matrix-vector work (the C step and the peers' runtimes)
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "asimd", "sve")


def cpu_summary(cpuinfo: str | None = None) -> str:
    """``"AMD EPYC, x86_64, 2 CPUs, avx avx2 fma (no AVX-512)"``: the processor's model name, architecture, CPU
    count and the :data:`SIMD_FLAGS` it has, read from ``/proc/cpuinfo`` (``cpuinfo`` replaces that file's
    text); without it, what :mod:`platform` knows."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    parts = [
        model or platform.processor() or "unknown processor",
        platform.machine(),
        f"{os.cpu_count()} CPUs",
    ]
    if flags:
        simd = [f for f in SIMD_FLAGS if f in flags]
        x86 = "avx" in flags or "sse4_2" in flags
        note = " (no AVX-512)" if x86 and "avx512f" not in flags else ""
        parts.append((" ".join(simd) or "no listed SIMD extensions") + note)
    return ", ".join(parts)


if __name__ == "__main__":
    print(cpu_summary())


def command_line() -> str:
    """The command this process was started with, as a user would type it from the repository root (every flag
    given, none added): what a results file records so that its table can be made again."""
    return shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
