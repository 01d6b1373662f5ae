"""How the service reads a request's query, Accept and conditional/Range headers, against a real uvicorn server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.config import ServerConfig
from tests.server_fixtures import RunningServer, noisy, run_server, tiny_checkpoint, wav_bytes

WAV = "audio/wav"
AUDIO_ROUTES = {"/v1/enhance": ["format", "model", "high_band"], "/v1/analyze": ["format", "model", "audio"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny.safetensors")
    with run_server(ServerConfig(checkpoints=(str(checkpoint),), threads=1, max_concurrency=1)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer):
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def audio() -> bytes:
    return wav_bytes(noisy(0.5), 16000)


def _error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The project's error shape: JSON ``{"error": {"code", "message"}}`` with ``status``."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return dict(body["error"])


# ---------- query parameters ----------


@pytest.mark.parametrize("route", list(AUDIO_ROUTES))
def test_a_misspelt_query_parameter_is_refused(client: httpx.Client, audio: bytes, route: str) -> None:
    """?fromat=flac was ignored: a 200 WAV the client took for FLAC."""
    resp = client.post(f"{route}?fromat=flac", content=audio, headers={"Content-Type": WAV})
    message = _error(resp, 422, "unknown_parameter")["message"]
    assert "'fromat'" in message, message
    assert all(name in message for name in AUDIO_ROUTES[route]), message


@pytest.mark.parametrize("route", list(AUDIO_ROUTES))
def test_a_repeated_query_parameter_is_refused(client: httpx.Client, audio: bytes, route: str) -> None:
    """?format=flac&format=wav gave WAV (the last one won, silently)."""
    resp = client.post(f"{route}?format=png&format=json", content=audio, headers={"Content-Type": WAV})
    assert "'format'" in _error(resp, 422, "repeated_parameter")["message"]


def test_every_known_query_parameter_is_still_taken(client: httpx.Client, audio: bytes) -> None:
    resp = client.post(
        "/v1/enhance?format=flac&model=tiny&high_band=drop", content=audio, headers={"Content-Type": WAV}
    )
    assert resp.status_code == 200 and resp.headers["content-type"] == "audio/flac", resp.text
    resp = client.post("/v1/analyze?format=json&model=tiny", content=audio, headers={"Content-Type": WAV})
    assert resp.status_code == 200 and "blocks" in resp.json(), resp.text


def test_the_web_page_sends_only_known_parameters(client: httpx.Client, audio: bytes) -> None:
    """The page builds its own queries: none of them may now be refused. Each query string it writes names only
    parameters the OpenAPI document gives its route, and the request it sends is answered."""
    script = (Path(__file__).resolve().parents[1] / "server" / "static" / "app.js").read_text()
    queries = re.findall(r'"v1/(\w+)\?([^"$]*)"', script)
    assert ("analyze", "audio=wav") in queries, queries  # the one request of a run
    assert "model=${encodeURIComponent(model)}" in script
    paths = client.get("/openapi.json").json()["paths"]
    for route, query in queries:
        taken = {p["name"] for p in paths[f"/v1/{route}"]["post"]["parameters"] if p["in"] == "query"}
        assert {pair.split("=")[0] for pair in query.split("&")} | {"model"} <= taken, (route, query)
        resp = client.post(f"/v1/{route}?{query}&model=tiny", content=audio, headers={"Content-Type": WAV})
        assert resp.status_code == 200, resp.text


# ---------- Accept on /v1/analyze ----------


def _analyze(client: httpx.Client, audio: bytes, accept: str | None, query: str = "") -> httpx.Response:
    """POST /v1/analyze with ``accept`` as the Accept header; None sends no Accept header at all."""
    request = client.build_request(
        "POST", f"/v1/analyze{query}", content=audio, headers={"Content-Type": WAV}
    )
    if accept is None:
        del request.headers["accept"]
    else:
        request.headers["accept"] = accept
    return client.send(request)


@pytest.mark.parametrize("accept", ["text/html", "application/json;q=0", "audio/wav, */*;q=0"])
def test_analyze_refuses_an_accept_it_cannot_answer(client: httpx.Client, audio: bytes, accept: str) -> None:
    """Accept: text/html got a 200 JSON; /v1/enhance says 406 for an Accept it cannot satisfy."""
    message = _error(_analyze(client, audio, accept), 406, "not_acceptable")["message"]
    assert "application/json" in message and "image/png" in message, message


@pytest.mark.parametrize(
    "accept",
    [
        None,
        "*/*",
        "application/*",
        "application/json;q=0.5",
        "text/html, application/json;q=0.1",
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",  # a browser's navigation
        "image/png, application/json",  # JSON, as before, when both are named
    ],
)
def test_analyze_answers_json_to_an_accept_that_allows_it(
    client: httpx.Client, audio: bytes, accept: str | None
) -> None:
    resp = _analyze(client, audio, accept)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json", resp.text


@pytest.mark.parametrize(
    ("accept", "query"), [("image/png, */*;q=0.5", ""), ("image/*", ""), ("text/html", "?format=png")]
)
def test_analyze_draws_png_when_asked(client: httpx.Client, audio: bytes, accept: str, query: str) -> None:
    """An explicit ?format= wins over Accept, as on /v1/enhance."""
    resp = _analyze(client, audio, accept, query)
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/png", resp.text


# ---------- the web page: conditional requests ----------


def test_the_page_is_revalidated_with_its_etag(client: httpx.Client) -> None:
    """``/`` promised revalidation (Cache-Control: no-cache) but answered 200 in full to a matching ETag."""
    page = client.get("/")
    etag = page.headers["etag"]
    for method in ("GET", "HEAD"):
        again = client.request(method, "/", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b"", method
        assert again.headers["etag"] == etag and again.headers["cache-control"] == "no-cache"
    assert client.get("/", headers={"If-None-Match": f"W/{etag}"}).status_code == 304  # weak comparison
    changed = client.get("/", headers={"If-None-Match": '"an-earlier-version"'})
    assert changed.status_code == 200 and changed.content == page.content
    assert changed.headers["cache-control"] == "no-cache"


# ---------- Range on the page and its files ----------

STATIC = ["/", "/static/app.js", "/favicon.ico"]


@pytest.mark.parametrize("path", STATIC)
@pytest.mark.parametrize("bad", ["bytes=abc", "pages=0-10", "bytes=10-5", "nonsense"])
def test_a_malformed_range_is_a_json_400(client: httpx.Client, path: str, bad: str) -> None:
    """Starlette's answer was a plain-text 400; the README promises JSON errors for bad input."""
    message = _error(client.get(path, headers={"Range": bad}), 400, "invalid_range")["message"]
    assert "Range" in message, message


@pytest.mark.parametrize("path", STATIC)
def test_an_unsatisfiable_range_is_a_json_416(client: httpx.Client, path: str) -> None:
    """It was an empty text/plain 416."""
    size = len(client.get(path).content)
    resp = client.get(path, headers={"Range": f"bytes={size}-"})
    assert f"{size}" in _error(resp, 416, "range_not_satisfiable")["message"]
    assert resp.headers["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize("path", STATIC)
def test_a_good_range_is_still_served(client: httpx.Client, path: str) -> None:
    full = client.get(path).content
    part = client.get(path, headers={"Range": "bytes=2-9"})
    assert part.status_code == 206 and part.content == full[2:10]
    assert part.headers["content-range"] == f"bytes 2-9/{len(full)}"
