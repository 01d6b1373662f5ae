"""Command-line number options shared by ``enhance-cli`` and ``enhance-server``: what does not parse, or is out
of range, is an argparse usage error naming the flag and what it takes; and ``--version``."""

from __future__ import annotations

import argparse
import math
from typing import Any


def package_version() -> str:
    """The installed tim-enhance's version, for ``--version``."""
    from importlib import metadata

    try:
        return metadata.version("tim-enhance")
    except metadata.PackageNotFoundError:
        return "unknown"


def number(text: str, kind: type[int] | type[float]) -> Any:
    """``kind(text)``, or a usage error that says what was expected (argparse's own named the type function:
    "invalid _seconds value")."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}"
        ) from None


def bounded(
    kind: type[int] | type[float], low: float, *, above: bool = False, high: float | None = None
) -> Any:
    """An argparse ``type``: a finite ``kind`` at least ``low`` (more than it with ``above``), at most ``high``.
    Out of range is a usage error naming the flag ("--max-upload-mb -1" said "max_upload_bytes must be
    positive", "--max-upload-mb nan" "cannot convert float NaN to integer", and "--limit-concurrency 0" started
    a server that answered every request 503)."""
    bound = f"more than {low:g}" if above else f"at least {low:g}"
    if high is not None:
        bound += f" and at most {high:g}"

    def parse(text: str) -> int | float:
        value = number(text, kind)
        if not (
            math.isfinite(value)
            and (value > low if above else value >= low)
            and (high is None or value <= high)
        ):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    return parse


def attenuation_db(text: str) -> float:
    """``--max-attenuation-db`` (enhance-cli, recipes.evaluate): a number of dB >= 0, or inf (checked as
    :meth:`models.Enhancer.set_max_attenuation` will check it)."""
    value = number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 dB (or inf for no limit), got {text}")
    return value
