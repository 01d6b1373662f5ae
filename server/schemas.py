"""Request and response models (they are also the OpenAPI schema's components, with examples)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from enhance.audio_io import MAX_CHANNELS, MAX_STREAM_RATE, MIN_RATE

MODEL_NAME_MAX = 100  # characters of a model name in a request (?model=, a stream's start message)


class ErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable reason", examples=["invalid_audio"])
    message: str = Field(
        description="one line for humans", examples=["take.wav: 1 sample(s) are NaN or infinite"]
    )
    details: list[dict[str, Any]] | None = Field(
        None,
        description="invalid_request only: each invalid parameter, as {loc: [where, name], message}",
        examples=[[{"loc": ["query", "format"], "message": "Input should be 'wav', 'flac' or 'ogg'"}]],
    )


class ErrorResponse(BaseModel):
    error: ErrorDetail


class _CaseInsensitive(str, Enum):
    """A query-parameter enum that takes any case (``?format=WAV``), as the CLI's ``--format`` does."""

    @classmethod
    def _missing_(cls, value: object) -> _CaseInsensitive | None:
        if isinstance(value, str):
            for member in cls:
                if member.value == value.lower():
                    return member
        return None


class AudioFormat(_CaseInsensitive):
    wav = "wav"
    flac = "flac"
    ogg = "ogg"


class HighBand(_CaseInsensitive):
    gate = "gate"
    drop = "drop"


class AnalyzeFormat(_CaseInsensitive):
    json = "json"
    png = "png"


class HealthResponse(BaseModel):
    status: Literal["ok", "failed"] = "ok"


class ReadyResponse(BaseModel):
    status: Literal["ready", "loading", "failed"] = Field(examples=["ready"])
    models: list[str] = Field(default_factory=list, examples=[["default"]])
    error: str | None = Field(default=None, description="why loading failed")


class ModelInfo(BaseModel):
    name: str = Field(examples=["default"])
    default: bool = Field(description="used when a request names no model")
    source: Literal["bundled", "file"]
    config_name: str = Field(description="the name stored in the checkpoint", examples=["tim"])
    parameters: int = Field(examples=[5904907])
    sample_rate: int = Field(
        description="the model's own rate; inputs at other rates are resampled", examples=[16000]
    )
    n_mechanisms: int = Field(description="TIM mechanisms per layer (1: plain Transformer)", examples=[2])
    competition_blocks: list[int] = Field(
        description="1-based blocks with competition maps", examples=[[3, 4, 5, 6, 7]]
    )
    latency_ms: float = Field(description="algorithmic delay of the streaming engine", examples=[48.0])
    stream_backend: str = Field(
        description="what runs this model's WebSocket streams (enhance-server --stream-backend, 'auto' resolved)",
        examples=["native"],
    )
    stream_device: str = Field(
        description="where this model's WebSocket streams run (enhance-server --stream-device)",
        examples=["cpu"],
    )


class ModelsResponse(BaseModel):
    models: list[ModelInfo]


class BlockCompetition(BaseModel):
    block: int = Field(description="1-based block number", examples=[3])
    maps: list[list[float]] = Field(
        description="competition scores of channel 0, [frames][n_s]; each frame's scores sum to 1",
        examples=[[[0.91, 0.09], [0.88, 0.12]]],
    )
    mean_entropy: float = Field(description="mean competition entropy per frame (nats)", examples=[0.31])
    max_entropy: float = Field(description="ln(n_s): the entropy of a uniform split", examples=[0.69315])
    win_share: list[float] = Field(
        description="fraction of frames each mechanism wins", examples=[[0.8, 0.2]]
    )


class AnalyzeResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "model": "default",
                "sample_rate": 44100,
                "channels": 1,
                "duration_s": 0.032,
                "channel": 0,
                "n_mechanisms": 2,
                "hop_s": 0.016,
                "frame_times": [0.0, 0.016, 0.032],
                "blocks": [
                    {
                        "block": 3,
                        "maps": [[0.9, 0.1], [0.7, 0.3], [0.6, 0.4]],
                        "mean_entropy": 0.49,
                        "max_entropy": 0.69315,
                        "win_share": [1.0, 0.0],
                    }
                ],
                "input_rms_dbfs": -23.5,
                "output_rms_dbfs": -26.1,
                "processing_seconds": 0.05,
                "warnings": [],
            }
        }
    )

    model: str
    sample_rate: int = Field(description="the input's sample rate")
    channels: int = Field(description="the input's channel count")
    duration_s: float
    channel: int = Field(0, description="the channel the maps are of (always 0: the first channel)")
    n_mechanisms: int
    hop_s: float = Field(description="seconds between frames")
    frame_times: list[float] = Field(description="centre time (s) of each frame of the maps")
    blocks: list[BlockCompetition] = Field(description="one entry per TIM block with competition")
    input_rms_dbfs: float | None = Field(description="RMS level of the input, all channels (None: silence)")
    output_rms_dbfs: float | None = Field(description="RMS level of the enhanced audio, all channels")
    processing_seconds: float
    warnings: list[str] = Field(
        default_factory=list,
        description="what /v1/enhance's X-Enhance-Warning says: the input is digital silence, or its audio ends "
        "before the length its header gives (enhanced as far as it decodes)",
    )


class StreamStart(BaseModel):
    """The first message of a WebSocket stream (JSON text)."""

    model_config = ConfigDict(extra="forbid")

    # optional: every other message of the protocol has a "type", so clients send one here too (it was refused)
    type: Literal["start"] = "start"
    sample_rate: int = Field(16000, ge=MIN_RATE, le=MAX_STREAM_RATE)
    # the server's --max-channels (default 8) is checked after this, as for a POST
    channels: int = Field(1, ge=1, le=MAX_CHANNELS)
    format: Literal["s16le", "f32le"] = "s16le"
    model: str | None = Field(None, max_length=MODEL_NAME_MAX)
    api_key: str | None = Field(None, description="for browsers, which cannot set headers on WebSockets")
    resampling: Literal["high", "low_latency"] = Field(
        "high",
        description="when sample_rate is not 16000: soxr's HQ filters (the offline path's), or its LQ ones, which "
        "hold back less audio (at 48 kHz about 28 ms instead of 50; the output is then not the POST's to the bit)",
    )
    high_band: Literal["gate", "drop"] = Field(
        "gate",
        description="when sample_rate is above 16000: keep the band above 8 kHz, gated by the model's 6-8 kHz gain "
        "(gate, as POST /v1/enhance), or leave it out (drop: the 16 kHz model's band only)",
    )

    @field_validator("sample_rate", "channels", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        """JSON numbers only: "16000" and true were taken for numbers (true as 1 channel); 16000.0, which
        clients that hold rates as floats send, stays accepted."""
        if isinstance(value, bool | str):
            raise ValueError("must be a JSON number, not a string or a boolean")
        return value

    @field_validator("type", "format", "resampling", "high_band", mode="before")
    @classmethod
    def _any_case(cls, value: Any) -> Any:
        """Names in any case, as the POST's query parameters take them ("GATE", "S16LE")."""
        return value.lower() if isinstance(value, str) else value


class StreamReady(BaseModel):
    type: Literal["ready"] = "ready"
    model: str
    sample_rate: int
    channels: int
    format: str
    latency_ms: float = Field(
        description="audio held back at most, in steady state: the engine's algorithmic delay plus resampling_ms"
    )
    engine_latency_ms: float = Field(description="the engine's algorithmic delay (window + lookahead)")
    resampling_ms: float = Field(
        description="the most the two resamplers add to the engine's delay (0 at 16 kHz), with 10 ms frames"
    )
    engine_sample_rate: int = Field(16000, description="the rate the model works at (the engine's input)")
