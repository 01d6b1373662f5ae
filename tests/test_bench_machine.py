"""bench/machine.py: the processor line of the timing benchmarks' headers names the model and the vector
extensions that decide the C step's speed, so tables from different hosts are not compared by mistake."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from machine import cpu_summary  # noqa: E402

EPYC = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma f16c\n\nprocessor\t: 1\n"
XEON = "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: sse4_2 avx avx2 fma avx512f avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes\nCPU implementer\t: 0x41\n"


def test_names_the_model_and_its_vector_extensions() -> None:
    tail = f"{platform.machine()}, {os.cpu_count()} CPUs"
    assert cpu_summary(EPYC) == f"AMD EPYC, {tail}, sse4_2 avx avx2 fma f16c (no AVX-512)"
    assert (
        cpu_summary(XEON)
        == f"Intel(R) Xeon(R) Platinum 8481C, {tail}, sse4_2 avx avx2 fma avx512f avx512_vnni"
    )
    arm = cpu_summary(ARM)
    assert arm.endswith(", asimd") and "AVX-512" not in arm


def test_without_cpuinfo_falls_back_to_what_platform_knows() -> None:
    assert cpu_summary("").endswith(f"{platform.machine()}, {os.cpu_count()} CPUs")


@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="reads /proc/cpuinfo (Linux)")
def test_reads_this_machines_cpuinfo() -> None:
    assert cpu_summary() == cpu_summary(Path("/proc/cpuinfo").read_text())
