"""Errors users see: one class per thing that can be wrong with their input, each with a one-line reason."""

from __future__ import annotations


class EnhanceError(Exception):
    """Base class of the errors about users' audio and requests (CLI message, HTTP 4xx). A checkpoint that
    cannot be loaded raises :class:`models.checkpoint.CheckpointError` instead (models imports
    nothing of enhance but the standard-library :mod:`enhance.atomic_files`)."""


class AudioError(EnhanceError, ValueError):
    """Input audio that cannot be enhanced: unreadable, empty, too short, NaN/inf samples..."""
