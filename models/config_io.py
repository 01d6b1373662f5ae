"""Strict conversion between (nested, frozen) config dataclasses and plain JSON-able dicts.

Unknown or missing keys are errors: a checkpoint whose config this code does not understand is refused, never
silently reinterpreted.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(cfg: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    _refuse_unknown(cls, data, where)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue  # the dataclass default applies (a field added after the file was written)
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def check_keys(cls: type, data: dict[str, Any], where: str = "config") -> None:
    """Raise :func:`from_dict`'s ValueError for the first unknown key in ``data`` (nested sections included),
    building nothing: for a part of a configuration (one of several files merged), whose values alone need not
    make a valid one."""
    _refuse_unknown(cls, data, where)
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        if dataclasses.is_dataclass(hints[key]) and isinstance(value, dict):
            check_keys(hints[key], value, f"{where}.{key}")


def _refuse_unknown(cls: Any, data: dict[str, Any], where: str) -> None:
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} for {cls.__name__}")


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, where) if len(args) == 1 else value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)  # type: ignore[arg-type]
    if origin is tuple:
        parts = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):  # a string would become a tuple of its characters
            raise ValueError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        if parts and parts[-1] is not Ellipsis and len(value) != len(parts):
            raise ValueError(f"{where}: expected a list of {len(parts)} values, got {len(value)}")
        inner = (
            list(parts[:1]) * len(value)
            if parts and parts[-1] is Ellipsis
            else list(parts) or [Any] * len(value)
        )
        return tuple(
            _convert(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(inner, value, strict=True))
        )
    return _scalar(hint, value, where)


def _scalar(hint: Any, value: Any, where: str) -> Any:
    """``value`` as a ``hint`` (bool, int, float or str), or ValueError: JSON's 3 is a float's 3.0 and 3.0 an
    int's 3, nothing else is converted (a quoted "3" is an error where it would fail later, far from its cause)."""
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
        if ok and not math.isfinite(value):  # NaN never equals itself: a run with one could not be resumed
            raise ValueError(f"{where}: expected a finite number, got {value}")
    elif hint is str:
        ok = isinstance(value, str)
    else:
        return value
    if not ok:
        raise ValueError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
