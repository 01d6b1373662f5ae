"""Prometheus metrics in the text exposition format (0.0.4), without extra dependencies.

Counters, gauges and histograms with labels; every update takes a lock, so model threads may update them too.
Route labels are route templates (``/v1/enhance``), never raw paths, so unknown URLs cannot blow up the series.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = ""

    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> LabelValues:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name}: expected labels {self.labels}, got {sorted(labels)}")
        return tuple(str(labels[k]) for k in self.labels)

    def _labels(self, key: LabelValues, extra: str = "") -> str:
        parts = [f'{k}="{_escape(v)}"' for k, v in zip(self.labels, key, strict=True)]
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}" if parts else ""

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, doc, labels)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [*self.header(), *(f"{self.name}{self._labels(k)} {_fmt(v)}" for k, v in items)]


class Gauge(Counter):
    kind = "gauge"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def dec(self, amount: float = 1.0, **labels: str) -> None:
        self.inc(-amount, **labels)

    def set(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self, name: str, doc: str, labels: Sequence[str] = (), buckets: Iterable[float] = LATENCY_BUCKETS
    ) -> None:
        super().__init__(name, doc, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {}  # counts per bucket, [sum, count]

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            counts, totals = self._series.setdefault(key, ([0] * len(self.buckets), [0.0, 0.0]))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    counts[i] += 1
            totals[0] += value
            totals[1] += 1

    def count(self, **labels: str) -> int:
        with self._lock:
            series = self._series.get(self._key(labels))
            return int(series[1][1]) if series else 0

    def render(self) -> list[str]:
        lines = self.header()
        with self._lock:
            items = sorted((k, (list(c), list(t))) for k, (c, t) in self._series.items())
        for key, (counts, (total, n)) in items:
            for bound, c in zip(self.buckets, counts, strict=True):
                le = 'le="' + _fmt(bound) + '"'
                lines.append(f"{self.name}_bucket{self._labels(key, le)} {c}")
            inf = 'le="+Inf"'
            lines.append(f"{self.name}_bucket{self._labels(key, inf)} {int(n)}")
            lines.append(f"{self.name}_sum{self._labels(key)} {_fmt(total)}")
            lines.append(f"{self.name}_count{self._labels(key)} {int(n)}")
        return lines


def resident_memory_bytes(pid: int | None = None) -> int | None:
    """Resident set size of a process (Linux ``/proc``), or None where unavailable."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Metrics:
    """The server's metrics (one instance per app)."""

    def __init__(self) -> None:
        self.requests = Counter(
            "tim_http_requests_total",
            "HTTP requests by route, method and status",
            ("route", "method", "status"),
        )
        self.latency = Histogram(
            "tim_http_request_duration_seconds", "HTTP request latency by route", ("route", "method")
        )
        self.in_flight = Gauge("tim_http_requests_in_flight", "HTTP requests being served")
        self.enhancing = Gauge("tim_enhancements_running", "enhancement jobs holding a concurrency slot")
        self.waiting = Gauge("tim_enhancements_waiting", "requests queued for an enhancement slot")
        self.audio_seconds = Counter(
            "tim_audio_seconds_processed_total", "seconds of input audio enhanced, by route", ("route",)
        )
        self.rejections = Counter(
            "tim_rejections_total", "requests refused, by reason (the error code)", ("reason",)
        )
        self.streams = Gauge("tim_streams_active", "open WebSocket streams")
        self.streams_total = Counter(
            "tim_streams_total", "WebSocket streams by outcome (done, error, disconnected)", ("outcome",)
        )
        self.model_ready = Gauge("tim_model_ready", "1 when the models are loaded, else 0")
        self._all: list[_Metric] = [
            self.requests,
            self.latency,
            self.in_flight,
            self.enhancing,
            self.waiting,
            self.audio_seconds,
            self.rejections,
            self.streams,
            self.streams_total,
            self.model_ready,
        ]
        self.in_flight.set(0)
        self.enhancing.set(0)
        self.waiting.set(0)
        self.streams.set(0)
        self.model_ready.set(0)

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._all:
            lines.extend(metric.render())
        rss = resident_memory_bytes()
        if rss is not None:
            lines += [
                "# HELP process_resident_memory_bytes Resident memory size in bytes.",
                "# TYPE process_resident_memory_bytes gauge",
                f"process_resident_memory_bytes {rss}",
            ]
        return "\n".join(lines) + "\n"
