"""Building the C step (:file:`enhance/native_step.c`) and finding a build to load: standard library only, so that
it also runs as a script where the package is not installed (a Docker build stage with a compiler).

Where :func:`locate` finds the shared library, in this order:

1. ``$TIM_ENHANCE_CACHE`` (default ``~/.cache/tim-enhance``) already holds a build for this source, compiler, flags
   and CPU: it is used.
2. A C compiler (``cc``, or ``$CC``) is there: the source is compiled with ``-O3 -march=native`` into that cache,
   atomically (a temporary file beside it, then renamed, so a concurrent first use is safe).
3. No compiler, and ``$TIM_ENHANCE_PREBUILT`` names a folder of prebuilt libraries: the one made from this very
   source (its SHA-256 in the name) for the highest x86-64 level this CPU has (``x86-64-v4``: AVX-512;
   ``x86-64-v3``: AVX2, FMA, F16C; ``x86-64-v2``; ``x86-64``), else the next level down that is there (never one
   above the CPU's), or the ``generic`` build on other processors. The Docker image, which has no compiler,
   ships these.

Otherwise :class:`NativeUnavailable` says what is missing. ``python enhance/native_build.py --prebuild DIR`` writes
the prebuilt libraries (every x86-64 level on x86 machines; one ``generic`` build elsewhere). A library built for a
level runs the kernels of that level (``native_step.c`` selects them at compile time), so a prebuilt ``x86-64-v3``
library on an AVX2 CPU is the build ``-march=native`` would make there, but for tuning.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("native_step.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fno-trapping-math", "-fPIC", "-shared", "-std=gnu11")
PREBUILT_ENV = "TIM_ENHANCE_PREBUILT"

# the x86-64 micro-architecture levels (GCC's -march names), highest first, each with the /proc/cpuinfo flags it
# needs beyond the one below it (Linux names LZCNT "abm" and SSE3 "pni")
X86_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("x86-64-v4", frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})),
    ("x86-64-v3", frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})),
    ("x86-64-v2", frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})),
    ("x86-64", frozenset()),
)


class NativeUnavailable(RuntimeError):
    """The C step cannot be built or loaded here (no compiler and no matching prebuilt library, or it failed)."""


def cache_dir() -> Path:
    root = os.environ.get("TIM_ENHANCE_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tim-enhance"


def cpu_flags_line() -> str:
    """The CPU's feature line of ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on ARM), else what
    :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def x86_level(flags: set[str]) -> str:
    """The highest x86-64 level whose features, and those of every level below it, ``flags`` has."""
    best = X86_LEVELS[-1][0]
    for level, needs in reversed(X86_LEVELS):
        if not needs <= flags:
            break
        best = level
    return best


def source_key() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def prebuilt_name(level: str) -> str:
    return f"native_step-{source_key()}-{level}.so"


def prebuilt_levels() -> list[str]:
    return [level for level, _ in X86_LEVELS] if is_x86() else ["generic"]


def compile_library(cc: str, target: Path, flags: tuple[str, ...] | list[str]) -> None:
    """Compile :data:`SOURCE` with ``flags`` into ``target``, atomically. Raises :class:`NativeUnavailable` (no
    compiler, or it failed) or :class:`OSError` (the folder cannot be written)."""
    if shutil.which(cc) is None:
        raise NativeUnavailable(f"no C compiler ('{cc}' not found; set $CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".native_step-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True)
        if done.returncode != 0 and "-march=native" in flags:  # a compiler without -march=native: portable
            portable = [f for f in flags if f != "-march=native"]
            done = subprocess.run(
                [cc, *portable, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True
            )
        if done.returncode != 0:
            raise NativeUnavailable(f"compiling {SOURCE.name} with {cc} failed:\n{done.stderr.strip()}")
        os.chmod(tmp, 0o755)  # mkstemp's 0600 would keep other users of a shared cache from loading it
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _prebuilt() -> Path | None:
    """The library under ``$TIM_ENHANCE_PREBUILT`` made from this source for the highest level this CPU runs (its
    own, else the next one down that is there), or None."""
    folder = os.environ.get(PREBUILT_ENV)
    if not folder:
        return None
    levels = ["generic"]
    if is_x86():
        names = [level for level, _ in X86_LEVELS]
        levels = names[names.index(x86_level(set(cpu_flags_line().split()))) :]
    for level in levels:
        path = Path(folder) / prebuilt_name(level)
        if path.is_file():
            return path
    return None


def locate() -> Path:
    """The shared library to load (see the module docstring). Raises :class:`NativeUnavailable`."""
    cc = os.environ.get("CC", "cc")
    parts = [SOURCE.read_bytes(), cc.encode(), " ".join(FLAGS).encode(), cpu_flags_line().encode()]
    key = hashlib.sha256(b"\0".join([*parts, platform.machine().encode()])).hexdigest()[:16]
    target = cache_dir() / f"native_step-{key}.so"
    if target.exists():
        return target
    if shutil.which(cc) is None:
        prebuilt, folder = _prebuilt(), os.environ.get(PREBUILT_ENV)
        if prebuilt is not None:
            return prebuilt
        wanted = (
            f"a prebuilt library of this source for this CPU (none in ${PREBUILT_ENV}={folder}, which should "
            f"hold {prebuilt_name('<level>')})"
            if folder
            else f"prebuilt libraries (${PREBUILT_ENV})"
        )
        raise NativeUnavailable(
            f"the native backend needs a C compiler ('{cc}' not found; set $CC or install gcc) or {wanted}, or "
            "choose another backend (torchscript)"
        )
    try:
        compile_library(cc, target, FLAGS)
    except OSError as exc:
        raise NativeUnavailable(
            f"cannot build the native step into {target.parent} ({exc}); set $TIM_ENHANCE_CACHE to a "
            "writable folder or choose another backend (torchscript)"
        ) from None
    return target


def prebuild(out: Path, levels: list[str], cc: str) -> list[Path]:
    """Compile the library for each level into ``out`` (named by :func:`prebuilt_name`)."""
    made = []
    for level in levels:
        flags = [f for f in FLAGS if f != "-march=native"]
        if level != "generic":
            flags.insert(1, f"-march={level}")
        target = out / prebuilt_name(level)
        compile_library(cc, target, flags)
        made.append(target)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prebuild", type=Path, required=True, metavar="DIR", help="folder for the libraries")
    ap.add_argument("--levels", help="comma-separated (default: every x86-64 level, or 'generic' off x86)")
    args = ap.parse_args(argv)
    levels = args.levels.split(",") if args.levels else prebuilt_levels()
    known = prebuilt_levels()
    bad = [level for level in levels if level not in known]
    if bad:
        ap.error(f"unknown level(s) {', '.join(bad)} (known here: {', '.join(known)})")
    try:
        for path in prebuild(args.prebuild, levels, os.environ.get("CC", "cc")):
            print(path)
    except (NativeUnavailable, OSError) as exc:
        print(f"native_build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
