"""JSON text for large answers without stalling the event loop.

``json.dumps`` is one C call that holds the GIL from start to end, so even in a worker thread the encoding of a
long file's competition maps (3.2 MB of JSON for 10 minutes) stalled the event loop, and every open stream's hops
with it, for as long as the whole call: 139-161 ms. :func:`json_bytes` gives the same bytes as ``JSONResponse``
in calls of at most ``rows`` list items, between which the other threads (the event loop) get their turn: 7-12 ms
(``bench/results/analyze-json/stall.py``, three runs).
"""

from __future__ import annotations

import json
from typing import Any

# JSONResponse's settings (starlette.responses.JSONResponse.render)
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def json_bytes(value: Any, rows: int = 1000) -> bytes:
    """``JSONResponse(value).body``, encoded in pieces of at most ``rows`` list items (ValueError for NaN or
    infinity, as JSONResponse)."""
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            out.append("{")
            for i, (key, item) in enumerate(v.items()):
                out.append(("," if i else "") + _dumps(str(key)) + ":")
                walk(item)
            out.append("}")
        elif isinstance(v, (list, tuple)) and len(v) > rows:
            out.append(
                "[" + ",".join(_dumps(list(v[i : i + rows]))[1:-1] for i in range(0, len(v), rows)) + "]"
            )
        elif isinstance(v, (list, tuple)) and v and isinstance(v[0], (dict, list, tuple)):
            out.append("[")
            for i, item in enumerate(v):
                if i:
                    out.append(",")
                walk(item)
            out.append("]")
        else:
            out.append(_dumps(v))

    walk(value)
    return "".join(out).encode("utf-8")
