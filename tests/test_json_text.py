"""server.json_text: the same bytes as JSONResponse, in pieces that let the event loop run."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

from server.json_text import json_bytes

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=5), inner, max_size=6),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(value=VALUES, rows=st.integers(1, 4))
def test_the_bytes_are_json_responses(value: Any, rows: int) -> None:
    assert json_bytes(value, rows=rows) == JSONResponse(value).body


def test_an_analysis_shaped_body_in_pieces() -> None:
    maps = [[round(i / 7 % 1, 4), round(1 - i / 7 % 1, 4)] for i in range(2500)]
    body = {
        "model": "défaut",
        "frame_times": [i * 0.016 for i in range(2500)],
        "blocks": [{"maps": maps}] * 3,
    }
    assert json_bytes(body) == JSONResponse(body).body
    assert json_bytes(body, rows=7) == JSONResponse(body).body


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_and_infinity_are_refused_as_json_response_refuses_them(bad: float) -> None:
    for value in ([bad], {"a": [[1.0, bad]] * 3}):
        with pytest.raises(ValueError):
            JSONResponse(value)
        with pytest.raises(ValueError):
            json_bytes(value, rows=2)
