"""The models a server holds: loaded once at start-up, looked up by name (never by a client's path)."""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from enhance.backends import NATIVE, resolve_backend, streaming_backend
from models import Checkpoint, CheckpointError, count_parameters, load_checkpoint
from models.checkpoint import read_metadata
from models.pretrained import load_pretrained, pretrained_path
from server.config import ServerConfig
from server.errors import ApiError, without_paths

log = logging.getLogger("server")


@dataclass
class LoadedModel:
    name: str
    checkpoint: Checkpoint
    source: str  # "bundled" or "file"
    stream_backend: Any = None  # runs WebSocket streams' steps, shared by all streams (None: PyTorch)
    stream_backend_name: str = "pytorch"  # which one (enhance.backends names, 'auto' resolved)
    stream_model: Any = None  # the model streams run: a copy on --stream-device when that is not --device

    @property
    def streaming_model(self) -> Any:
        return self.stream_model if self.stream_model is not None else self.checkpoint.model

    @property
    def stream_device(self) -> str:
        return str(next(self.streaming_model.parameters()).device)

    @property
    def competition_blocks(self) -> list[int]:
        return list(self.checkpoint.model.competition_blocks)

    @property
    def n_mechanisms(self) -> int:
        return self.checkpoint.config.n_mechanisms

    @property
    def parameters(self) -> int:
        return int(count_parameters(self.checkpoint.model))

    @property
    def latency_ms(self) -> float:
        return self.checkpoint.config.latency_ms


def split_alias(spec: str) -> tuple[str | None, str]:
    """``--checkpoint [ALIAS=]PATH`` as (ALIAS or None, PATH)."""
    alias, sep, path = spec.partition("=")
    if sep and alias and "/" not in alias and "\\" not in alias:
        if not path:  # read as the path "" it was ".: a folder, not a checkpoint file"
            raise CheckpointError(f"--checkpoint {spec}: no checkpoint file after '=' (ALIAS=PATH)")
        return alias, path
    return None, spec


def check_config(config: ServerConfig) -> None:
    """Cheap pre-flight (no weights read): every configured model exists, and a named C backend can be built (a
    compiler, the library already cached, or a prebuilt one). Raises :class:`CheckpointError`."""
    names = []
    for name in config.model_specs:
        pretrained_path(name)
        names.append(name)
    for spec in config.checkpoints:
        alias, path = split_alias(spec)
        stored = str(read_metadata(path)["name"])  # also behind an alias: a missing file started the server
        names.append(alias or stored)
    for name in names:  # (found by the load too, but only after the server had started, answering 503s)
        if names.count(name) > 1:
            raise CheckpointError(f"two models are named '{name}' (give one an alias: ALIAS=PATH)")
    if config.stream_backend in NATIVE:
        from enhance.native_backend import NativeUnavailable, library

        try:
            library()
        except NativeUnavailable as exc:
            raise CheckpointError(f"stream backend {config.stream_backend}: {exc}") from None


def load_models(config: ServerConfig) -> dict[str, LoadedModel]:
    """Load every configured model (first = default). Raises :class:`CheckpointError` on any problem."""
    if config.threads:
        torch.set_num_threads(config.threads)
    loaded: dict[str, LoadedModel] = {}

    def add(name: str, ck: Checkpoint, source: str) -> None:
        if name in loaded:
            raise CheckpointError(f"two models are named '{name}' (give one an alias: ALIAS=PATH)")
        ck.model.eval()
        stream_model = None
        if torch.device(config.stream_device) != torch.device(config.device):
            stream_model = copy.deepcopy(ck.model).to(config.stream_device).eval()
        streams = stream_model if stream_model is not None else ck.model
        kind = config.stream_backend
        try:
            kind = resolve_backend(streams, config.stream_backend)  # 'auto' resolved, for /v1/models
            backend = streaming_backend(streams, kind, threads=torch.get_num_threads())
        except Exception as exc:  # only streams need it: 'auto' falls back to PyTorch, a named one must work
            if config.stream_backend != "auto":
                raise CheckpointError(
                    f"model '{name}': stream backend {config.stream_backend}: {exc}"
                ) from None
            log.warning("model '%s': no %s step (%s); streams run on PyTorch", name, kind, exc)
            backend, kind = None, "pytorch"
        loaded[name] = LoadedModel(name, ck, source, backend, kind, stream_model)

    for name in config.model_specs:
        add(name, load_pretrained(name, device=config.device), "bundled")
    for spec in config.checkpoints:
        alias, path = split_alias(spec)
        ck = load_checkpoint(Path(path), map_location="cpu")
        ck.model.to(config.device)
        add(alias or ck.name, ck, "file")
    return loaded


def public_load_error(exc: BaseException, config: ServerConfig) -> str:
    """A loading error as clients see it (``/readyz``, the 503s): the exception's type and the first line of its
    message, with the configured checkpoint paths and any other absolute path cut to the file's name."""
    known: list[str] = []
    for spec in config.checkpoints:
        path = split_alias(spec)[1]
        known += [path, str(Path(path)), str(Path(path).expanduser().absolute()), str(Path(path).resolve())]
    lines = str(exc).strip().splitlines()
    text = without_paths(lines[0], known) if lines else "no details"
    return f"{type(exc).__name__}: {text}"[:500]


Loader = Callable[[ServerConfig], dict[str, LoadedModel]]


@dataclass
class ModelStore:
    """Loading status and the loaded models; ``get`` is what routes use."""

    status: str = "loading"  # loading | ready | failed
    error: str | None = None  # shown to clients: free of server paths (see public_load_error)
    models: dict[str, LoadedModel] = field(default_factory=dict)
    loaded_event: threading.Event = field(default_factory=threading.Event)

    @property
    def default(self) -> str | None:
        return next(iter(self.models), None)

    def set_loaded(self, models: dict[str, LoadedModel]) -> None:
        if not models:
            raise CheckpointError("no models configured")
        self.models, self.status, self.error = models, "ready", None
        self.loaded_event.set()

    def set_failed(self, message: str) -> None:
        self.status, self.error = "failed", message
        self.loaded_event.set()

    def get(self, name: str | None, retry_after: int = 2) -> LoadedModel:
        if self.status == "loading":
            raise ApiError(
                503, "model_loading", "the model is still loading", {"Retry-After": str(retry_after)}
            )
        if self.status == "failed":
            raise ApiError(503, "model_unavailable", f"the model failed to load: {self.error}")
        key = name or self.default
        if key not in self.models:
            known = ", ".join(self.models)
            raise ApiError(404, "model_not_found", f"no model named '{name}' is loaded (loaded: {known})")
        return self.models[key]
