"""Errors users see: one class per thing that can be wrong with their input, each with a one-line reason."""

from __future__ import annotations


class EnhanceError(Exception):
    """Base class of every error tim-enhance reports to users (CLI message, HTTP 4xx)."""


class AudioError(EnhanceError, ValueError):
    """Input audio that cannot be enhanced: unreadable, empty, too short, NaN/inf samples..."""
