"""The web page in headless Chromium (Playwright driving the system's Debian chromium): upload, enhance, draw.

Skipped (with the reason) when chromium or Playwright is missing. Recording runs on Chromium's fake microphone
(a tone); it ends in the same code path as the upload after a WAV conversion.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from server.config import ServerConfig
from tests.server_fixtures import noisy, run_server, tiny_checkpoint, wav_bytes

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# CI (.ci/run) installs chromium and sets TIM_REQUIRE_BROWSER=1, so there a missing browser fails, never skips
if CHROMIUM is None and os.environ.get("TIM_REQUIRE_BROWSER") == "1":
    raise RuntimeError("TIM_REQUIRE_BROWSER=1 but chromium is not installed (apt-get install chromium)")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)"
)

NON_BLANK = """(id) => {
    const c = document.getElementById(id);
    const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let coloured = 0;
    for (let i = 0; i < data.length; i += 4) {
        const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
        if (a > 0 && !(r > 245 && g > 245 && b > 245) && r + g + b > 30) coloured++;
    }
    return coloured / (data.length / 4);
}"""


ENDED = "['done', 'error'].includes(document.body.dataset.state)"
MODELS_LISTED = "document.getElementById('model-select').options.length > 0"


class Browser:
    """One Chromium page on the server's web page, with what it logged: uncaught errors, requests sent and
    failed (aborted), responses >= 400."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.posts: list[str] = []
        self.failed: list[str] = []
        self.bad_responses: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("request", lambda r: r.method == "POST" and self.posts.append(r.url))
        page.on("requestfailed", lambda r: self.failed.append(r.url))
        page.on("response", lambda r: r.status >= 400 and self.bad_responses.append(f"{r.status} {r.url}"))

    def posts_to(self, route: str) -> int:
        return sum(route in url for url in self.posts)

    def pick(self, path: Path) -> None:
        """Click the file input and pick ``path`` in the chooser it opens, as a user does (the click clears
        the input, so that the same file picked again runs again)."""
        with self.page.expect_file_chooser() as chooser:
            self.page.click("#file-input")
        chooser.value.set_files(str(path))

    def upload(self, path: Path, end: str = ENDED) -> str:
        """Pick ``path`` in the file input and wait for the run to end; the state it ended in."""
        self.page.evaluate("document.body.dataset.state = 'idle'")  # not the previous run's end
        self.pick(path)
        self.page.wait_for_function(end, timeout=60000, polling=100)
        return str(self.page.evaluate("document.body.dataset.state"))

    def status(self) -> str:
        return str(self.page.locator("#status").inner_text())


@contextmanager
def browser_on(
    srv: Any,
    width: int = 1280,
    scale: float = 1.0,
    microphone: bool = False,
    extra_args: tuple[str, ...] = (),
) -> Iterator[Browser]:
    """A page in headless Chromium; ``microphone``: Chromium's fake one (a tone), allowed without asking."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install playwright)"
    )
    assert CHROMIUM is not None
    args = (
        CHROMIUM_ARGS
        + (["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"] if microphone else [])
        + list(extra_args)
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": 1100},
                device_scale_factor=scale,
                permissions=["microphone"] if microphone else [],
            )
            yield Browser(context.new_page())
        finally:
            browser.close()


def test_upload_enhance_and_draw(tmp_path: Path) -> None:
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "noisy talk.wav"
    audio.write_bytes(wav_bytes(noisy(2.0, 22050, 1), 22050))
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        page, errors = b.page, b.errors
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert page.locator("#model-select").input_value() == "tiny"
        # before any file, the empty players are not shown (each was two unlabelled tab stops)
        assert (
            not page.locator("#noisy-audio").is_visible() and not page.locator("#enhanced-audio").is_visible()
        )
        page.wait_for_load_state("networkidle")
        assert not b.bad_responses, b.bad_responses
        for icon in (
            page.evaluate("document.querySelector('link[rel=icon]').href"),
            srv.url + "/favicon.ico",
        ):
            resp = httpx.get(icon)  # the page's icon, and the one browsers ask for without a link (was a 404)
            assert resp.status_code == 200 and resp.headers["content-type"] == "image/svg+xml", icon
            assert resp.content.startswith(b"<svg")
        assert b.upload(audio) == "done", b.status()
        assert page.get_attribute("#noisy-audio", "src", timeout=1000).startswith("blob:")
        assert page.get_attribute("#enhanced-audio", "src", timeout=1000).startswith("blob:")
        assert page.evaluate("document.getElementById('enhanced-audio').src !== ''")
        duration = page.evaluate(
            """() => new Promise((resolve) => {
                const a = document.getElementById('enhanced-audio');
                if (a.readyState >= 1) resolve(a.duration);
                a.addEventListener('loadedmetadata', () => resolve(a.duration));
                setTimeout(() => resolve(-1), 10000);
            })"""
        )
        assert duration == pytest.approx(2.0, abs=0.01)  # the enhanced WAV decodes, at full length
        for canvas in ("competition-canvas", "noisy-spectrogram", "enhanced-spectrogram"):
            assert page.evaluate(NON_BLANK, canvas) > 0.2, canvas
        summary = page.locator("#analysis-summary").inner_text()
        assert "tiny" in summary and "block" in summary
        assert page.locator("#download-link").is_visible()
        shot = tmp_path / "web_page.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"screenshot: {shot}")

        # the same file again: the input was reset, so picking it again is a change, and it runs again
        assert b.posts_to("v1/analyze") == 1
        assert b.upload(audio) == "done", b.status()
        assert b.posts_to("v1/analyze") == 2

        # a file neither the server nor the browser reads: the server's error, once, and nothing of the
        # previous file stays on screen
        bad = tmp_path / "broken.wav"
        bad.write_bytes(b"this is not audio" * 100)
        assert b.upload(bad) == "error"
        assert "unsupported_format" in b.status(), b.status()  # the server's structured error
        assert b.posts_to("v1/analyze") == 3  # the browser could not decode it either: no second upload
        for canvas in ("competition-canvas", "noisy-spectrogram", "enhanced-spectrogram"):
            assert page.evaluate(NON_BLANK, canvas) == 0, canvas
        assert page.locator("#analysis-summary").inner_text() == ""
        assert not page.locator("#download-link").is_visible()
        assert page.evaluate("document.getElementById('enhanced-audio').getAttribute('src')") is None

        # digital silence is enhanced like any audio; the server's warning (X-Enhance-Warning) is on the page
        silent = tmp_path / "silent.wav"
        silent.write_bytes(wav_bytes(np.zeros((16000, 1), np.float32), 16000))
        assert b.upload(silent) == "done", b.status()
        assert "Warning: silent.wav: all samples are zero (digital silence)." in b.status(), b.status()
        # drawn black: relative to its own peak (the floor) the zeros were all drawn brightest
        for canvas in ("noisy-spectrogram",):
            centre = page.evaluate(
                """(id) => { const c = document.getElementById(id);
                    return Array.from(c.getContext('2d').getImageData(c.width * 0.6, c.height * 0.4, 1, 1).data); }""",
                canvas,
            )
            assert sum(centre[:3]) < 30, (canvas, centre)
        assert b.posts_to("v1/analyze") == 4
        # a readable file that cannot be enhanced: the server's error, and the page does not re-encode and post it
        nan = tmp_path / "nan.wav"
        x = np.zeros((16000, 1), np.float32)
        x[100] = np.nan
        nan.write_bytes(wav_bytes(x, 16000, subtype="FLOAT"))
        assert b.upload(nan) == "error"
        assert "invalid_audio" in b.status(), b.status()
        assert b.posts_to("v1/analyze") == 5
        assert not errors, errors


def wait_until_held(page: Any, held: list[Any], timeout_s: float = 20.0) -> None:
    """Until the page's request has reached the route handler that holds it (Playwright runs handlers while it
    waits), then that exactly one is held."""
    deadline = time.monotonic() + timeout_s
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert len(held) == 1, f"{len(held)} requests held"


def test_a_newer_upload_wins(tmp_path: Path) -> None:
    """A second file picked while the first is still being enhanced: the first run's requests are aborted and
    only the second file's results end on screen (both runs once wrote to the page, the last to finish won)."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    first, second = tmp_path / "first.wav", tmp_path / "second.wav"
    first.write_bytes(wav_bytes(noisy(3.0, 16000, 1, seed=1), 16000))
    second.write_bytes(wav_bytes(noisy(1.0, 16000, 1, seed=2), 16000))
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        page = b.page
        held: list[Any] = []

        def hold_the_first(route: Any) -> None:  # the first file's enhancement is held until we let it go
            if "first.wav" in (route.request.post_data_buffer or b"").decode("latin-1") and not held:
                held.append(route)
            else:
                route.continue_()

        page.route("**/v1/analyze*", hold_the_first)
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        b.pick(first)
        page.wait_for_function("document.body.dataset.state === 'working'", timeout=10000)
        wait_until_held(page, held)
        assert b.upload(second) == "done", b.status()
        assert any("v1/analyze" in url for url in b.failed), b.failed  # the first run's request: aborted
        with contextlib.suppress(Exception):  # already aborted by the page: continuing it may be refused
            held[0].continue_()
        page.wait_for_timeout(1500)  # time for a first run that was not stopped to finish and draw
        assert page.evaluate("document.body.dataset.state") == "done"
        assert "second.wav (1.00 s)" in b.status(), b.status()
        assert "1.00 s at 16000 Hz" in page.locator("#analysis-summary").inner_text()
        assert b.posts_to("v1/analyze") == 2  # one request per run: the first's (aborted) and the second's
        assert not b.errors, b.errors


def test_a_fixed_api_key_clears_the_error(tmp_path: Path) -> None:
    """On a server with a key, the page opens on the models list's 401; once the right key is typed, the list
    loads, the stale 401 goes, and files are enhanced."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(1.0, 16000, 1), 16000))
    config = ServerConfig(checkpoints=(str(ck),), threads=1, api_key="s3cret")
    with run_server(config) as srv, browser_on(srv) as b:
        page = b.page
        page.goto(srv.url + "/")
        page.wait_for_function("document.body.dataset.state === 'error'", timeout=20000)
        assert "401" in b.status(), b.status()
        assert b.upload(audio) == "error" and "401" in b.status()
        assert "API key field" in b.status(), b.status()  # where the key goes on this page, not the headers
        page.fill("#api-key", "s3cret")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        page.wait_for_function("document.body.dataset.state === 'idle'", timeout=10000)
        assert b.status() == "Choose a file to start."
        assert b.upload(audio) == "done", b.status()
        assert not b.errors, b.errors


def test_a_file_the_browser_cannot_decode_still_shows_what_it_can(tmp_path: Path) -> None:
    """AIFF: the server reads it, Chromium does not. Both spectrograms were left blank with no word why, and the
    failed decode was an uncaught page error."""
    import soundfile as sf

    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "take.aiff"
    sf.write(audio, noisy(1.0, 16000, 1), 16000, format="AIFF")
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        b.page.goto(srv.url + "/")
        b.page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert b.upload(audio) == "done", b.status()
        assert "cannot decode the input" in b.status(), b.status()
        assert b.page.evaluate(NON_BLANK, "enhanced-spectrogram") > 0.2  # the WAV the server sent back
        assert b.page.evaluate(NON_BLANK, "noisy-spectrogram") == 0
        assert b.page.evaluate(NON_BLANK, "competition-canvas") > 0.2
        assert not b.errors, b.errors


def test_a_page_opened_while_the_model_loads_lists_it_once_loaded(tmp_path: Path) -> None:
    """The models list's 503 model_loading stayed on screen as an error, and the list empty, for good."""
    import threading

    from server.registry import load_models

    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    release = threading.Event()

    def slow_loader(config: ServerConfig) -> Any:
        assert release.wait(60)
        return load_models(config)

    config = ServerConfig(checkpoints=(str(ck),), threads=1, retry_after_s=1)
    with run_server(config, loader=slow_loader, wait_ready=False) as srv, browser_on(srv) as b:
        b.page.goto(srv.url + "/")
        b.page.wait_for_function(
            "document.getElementById('status').textContent.includes('loading')", timeout=20000
        )
        assert b.page.evaluate("document.body.dataset.state") == "idle"
        release.set()
        b.page.wait_for_function(MODELS_LISTED, timeout=30000)
        assert b.status() == "Choose a file to start."
        assert not b.errors, b.errors


def test_a_model_that_failed_to_load_is_an_error_and_a_non_latin1_key_is_named(tmp_path: Path) -> None:
    """A failed load (503 model_unavailable) showed "loading" for good, polled every second, retried uploads as
    "busy" and wiped their error. A key with a character a header cannot hold (a pasted zero-width space) read
    as "the server cannot be reached"."""
    from models import CheckpointError

    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(0.5, 16000, 1), 16000))

    def failing(config: ServerConfig) -> Any:
        raise CheckpointError("broken weights")

    config = ServerConfig(checkpoints=(str(ck),), threads=1, retry_after_s=1)
    with run_server(config, loader=failing, wait_ready=False) as srv, browser_on(srv) as b:
        gets: list[str] = []
        b.page.on("request", lambda r: "v1/models" in r.url and gets.append(r.url))
        b.page.goto(srv.url + "/")
        b.page.wait_for_function("document.body.dataset.state === 'error'", timeout=20000)
        assert "the model failed to load" in b.status() and "must be restarted" in b.status(), b.status()
        assert b.upload(audio) == "error"
        assert "the model failed to load" in b.status() and "busy" not in b.status(), b.status()
        b.page.wait_for_timeout(2500)  # a poll would have come every second (retry_after_s)
        assert len(gets) == 1, gets  # no polling
        assert b.posts_to("v1/analyze") == 1  # the upload was not retried
        assert "the model failed to load" in b.status(), b.status()  # nothing wiped it
        b.page.fill("#api-key", "secret\u200b")
        b.page.evaluate("document.body.dataset.state = 'idle'")
        assert b.upload(audio) == "error"
        assert "the API key holds a character that cannot be sent" in b.status(), b.status()
        assert not b.errors, b.errors


def test_both_requests_of_a_run_use_the_model_chosen_when_it_started(tmp_path: Path) -> None:
    """Each request read the menu when it was sent: a model picked mid-run gave one model's audio beside another
    model's maps."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(1.0, 16000, 1), 16000))
    config = ServerConfig(checkpoints=(str(ck), f"other={ck}"), threads=1)
    with run_server(config) as srv, browser_on(srv) as b:
        page = b.page
        held: list[Any] = []
        page.route("**/v1/analyze*", lambda route: held.append(route))
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert page.locator("#model-select").input_value() == "tiny"
        b.pick(audio)
        page.wait_for_function("document.body.dataset.state === 'working'", timeout=10000)
        wait_until_held(page, held)
        page.select_option("#model-select", "other")  # changed while the enhancement runs
        held[0].continue_()
        page.wait_for_function(ENDED, timeout=60000, polling=100)
        assert page.evaluate("document.body.dataset.state") == "done", b.status()
        assert [url.split("model=")[-1] for url in b.posts] == ["tiny"], (
            b.posts
        )  # one request: no second model
        assert "Model tiny" in page.locator("#analysis-summary").inner_text()
        # the list loaded again (a new API key) keeps the model chosen; it went back to the default
        page.evaluate(
            "document.querySelectorAll('#model-select option').forEach((o) => { o.dataset.old = '1'; })"
        )
        page.fill("#api-key", "any")  # this server has no key: any value lists the models
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("!document.querySelector('#model-select option[data-old]')", timeout=10000)
        assert page.locator("#model-select").input_value() == "other"
        assert not b.errors, b.errors


def test_the_busy_message_gives_way_to_the_runs_own_status_after_the_retry(tmp_path: Path) -> None:
    """After a 503 busy, "Server busy, retrying…" stayed on screen through the retried request and the whole
    enhancement."""
    import threading

    from tests.server_fixtures import gated_loader

    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(1.0, 16000, 1), 16000))
    gate = threading.Event()
    config = ServerConfig(checkpoints=(str(ck),), threads=1, max_concurrency=1, max_queue=0, retry_after_s=1)
    with run_server(config, loader=gated_loader(gate)) as srv, browser_on(srv) as b:
        page = b.page
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        page.evaluate(
            """() => { window.statuses = [];
                new MutationObserver(() => window.statuses.push(document.getElementById('status').textContent))
                    .observe(document.getElementById('status'), {childList: true, characterData: true, subtree: true}); }"""
        )
        holder = threading.Thread(
            target=lambda: httpx.post(
                srv.url + "/v1/enhance",
                content=audio.read_bytes(),
                headers={"Content-Type": "audio/wav"},
                timeout=60,
            )
        )
        holder.start()  # takes the only slot and waits at the gate: the page's request is refused (503 busy)
        try:
            for _ in range(400):
                if srv.app.state.jobs.running:
                    break
                page.wait_for_timeout(50)
            assert srv.app.state.jobs.running == 1
            b.pick(audio)
            page.wait_for_function(
                "window.statuses.some((s) => s.startsWith('Server busy'))", timeout=20000, polling=50
            )
        finally:
            gate.set()
        holder.join(timeout=60)
        page.wait_for_function(ENDED, timeout=60000, polling=100)
        assert page.evaluate("document.body.dataset.state") == "done", b.status()
        statuses = page.evaluate("window.statuses")
        busy = max(i for i, s in enumerate(statuses) if s.startswith("Server busy"))
        assert statuses[busy + 1] == "Enhancing a.wav…", statuses
        assert not b.errors, b.errors


# every microphone stream the page opens, to count the tracks still live afterwards
TRACK_STREAMS = """(() => {
    window.__streams = [];
    const get = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
    navigator.mediaDevices.getUserMedia = async (c) => { const s = await get(c); window.__streams.push(s); return s; };
})()"""
LIVE_TRACKS = "window.__streams.flatMap((s) => s.getTracks()).filter((t) => t.readyState === 'live').length"


def test_record_twice_quickly_then_stop_leaves_no_microphone_on(tmp_path: Path) -> None:
    """A second click on Record while the first waited for the microphone opened a second stream, whose recorder
    was forgotten: after Stop the microphone stayed on. Now Record is disabled at the first click; the recording
    is enhanced as an upload is, and the keyboard focus moves Record -> Stop -> Record."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    with (
        run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv,
        browser_on(srv, microphone=True) as b,
    ):
        page = b.page
        page.add_init_script(TRACK_STREAMS)
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        page.evaluate(
            "document.getElementById('record-btn').click(); document.getElementById('record-btn').click()"
        )
        page.wait_for_function("!document.getElementById('stop-btn').disabled", timeout=20000)
        assert page.evaluate("document.activeElement.id") == "stop-btn"
        page.wait_for_timeout(1500)  # a recording of about 1.5 s
        page.evaluate("document.body.dataset.state = 'idle'")
        page.click("#stop-btn")
        page.wait_for_function(ENDED, timeout=60000, polling=100)
        assert page.evaluate("document.body.dataset.state") == "done", b.status()
        assert page.evaluate("window.__streams.length") == 1
        assert page.evaluate(LIVE_TRACKS) == 0
        assert page.evaluate("document.activeElement.id") == "record-btn"
        assert not b.errors, b.errors


def test_record_without_a_microphone_keeps_the_focus_on_record(tmp_path: Path) -> None:
    """Record is disabled while the browser asks for the microphone; when there is none, the error named it but
    the focus, on the disabled button, fell to the page: the next Tab went to the Model menu."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        page = b.page
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        page.focus("#record-btn")
        page.keyboard.press("Space")
        page.wait_for_function("document.body.dataset.state === 'error'", timeout=20000)
        assert b.status().startswith("Microphone: "), b.status()
        assert not page.evaluate("document.getElementById('record-btn').disabled")
        assert page.evaluate("document.activeElement.id") == "record-btn"


def test_competition_maps_are_drawn_at_the_screens_width(tmp_path: Path) -> None:
    """On a phone-wide screen the fixed 1200-pixel drawing was shrunk to about 311 pixels: 3-pixel labels, 5-pixel
    rows. Now the canvas is drawn at its width on screen and the screen's pixel density."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "talk.wav"
    audio.write_bytes(wav_bytes(noisy(2.0, 16000, 1), 16000))
    config = ServerConfig(checkpoints=(str(ck),), threads=1)
    with run_server(config) as srv, browser_on(srv, width=375, scale=2.0) as b:
        page = b.page
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert b.upload(audio) == "done", b.status()
        css_width, pixels = page.evaluate(
            "(() => { const c = document.getElementById('competition-canvas'); return [c.clientWidth, c.width]; })()"
        )
        assert css_width < 375 and pixels == round(css_width * 2)
        # one mechanism row is 18 CSS pixels whatever the width: the tiny model has one TIM block of 2
        css_height = page.evaluate("document.getElementById('competition-canvas').clientHeight")
        assert css_height == pytest.approx((2 * 18 + 10 + 10 + 18 + 18), abs=2)  # + the colour bar
        assert page.evaluate(NON_BLANK, "competition-canvas") > 0.2
        # mechanism 0 is the top row, as in the table (it was drawn at the bottom): a map where it wins every
        # frame is bright (viridis yellow) on top and dark (purple) below
        top, below = page.evaluate(
            """() => {
                const c = document.getElementById('competition-canvas');
                drawCompetition(c, {duration_s: 1, n_mechanisms: 2, blocks: [{block: 3, maps: [[1, 0], [1, 0]]}]});
                const px = window.devicePixelRatio, x = Math.round(c.width * 0.6);
                const at = (y) => Array.from(c.getContext('2d').getImageData(x, Math.round(y * px), 1, 1).data);
                return [at(10 + 9), at(10 + 18 + 9)];
            }"""
        )
        assert top[0] > 200 and top[1] > 200 and top[2] < 100, top  # (253, 231, 37)
        assert below[0] < 100 and below[1] < 50 and below[2] > 60, below  # (68, 1, 84)

        # a wider window: the spectrograms are drawn again at their new width, as the maps are (they were only
        # stretched, their axis labels with them)
        page.set_viewport_size({"width": 1000, "height": 1100})
        page.wait_for_function(
            "(() => { const c = document.getElementById('noisy-spectrogram');"
            " return c.width === Math.round(c.clientWidth * 2) && c.clientWidth > 375; })()",
            timeout=5000,
        )
        assert page.evaluate(NON_BLANK, "noisy-spectrogram") > 0.2


def test_recording_outside_a_secure_context_says_why_it_cannot(tmp_path: Path) -> None:
    """Over plain HTTP at a LAN name the browser gives no microphone API: Record failed with "Cannot read
    properties of undefined (reading 'getUserMedia')" and stayed enabled. Now it is disabled, with the reason."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv:
        port = srv.url.rsplit(":", 1)[1]
        rules = ("--host-resolver-rules=MAP enhance.test 127.0.0.1",)
        with browser_on(srv, microphone=True, extra_args=rules) as b:
            b.page.goto(f"http://enhance.test:{port}/")
            b.page.wait_for_function(MODELS_LISTED, timeout=20000)
            assert b.page.evaluate("window.isSecureContext") is False  # what the test is about
            assert b.page.evaluate("document.getElementById('record-btn').disabled")
            assert b.page.locator("#record-note").is_visible()
            assert "HTTPS or localhost" in b.page.locator("#record-note").inner_text()
            assert not b.errors, b.errors
        with browser_on(srv, microphone=True) as b:  # at 127.0.0.1, a secure context: no note
            b.page.goto(srv.url + "/")
            b.page.wait_for_function(MODELS_LISTED, timeout=20000)
            assert not b.page.evaluate("document.getElementById('record-btn').disabled")
            assert not b.page.locator("#record-note").is_visible()


def test_an_unreachable_server_is_said_plainly_and_the_input_keeps_its_file(tmp_path: Path) -> None:
    """fetch's own words were shown ("Error: Failed to fetch"), and the file input, cleared as soon as a file
    was picked, said "No file chosen" beside the file being enhanced."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(1.0, 16000, 1), 16000))
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        page = b.page
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert b.upload(audio) == "done", b.status()
        assert page.evaluate("document.getElementById('file-input').files[0].name") == "a.wav"
        assert page.locator("#download-link").get_attribute("aria-label") == "download a.enhanced.wav"
        page.route("**/v1/analyze*", lambda route: route.abort())  # no answer, as from a stopped server
        assert b.upload(audio) == "error"
        assert "server cannot be reached" in b.status(), b.status()
        assert "Failed to fetch" not in b.status()
        assert not b.errors, b.errors


def test_cancel_stops_a_run_and_the_next_file_runs(tmp_path: Path) -> None:
    """A long file could be stopped only by picking another one."""
    ck = tiny_checkpoint(tmp_path / "tiny.safetensors")
    audio = tmp_path / "a.wav"
    audio.write_bytes(wav_bytes(noisy(1.0, 16000, 1), 16000))
    with run_server(ServerConfig(checkpoints=(str(ck),), threads=1)) as srv, browser_on(srv) as b:
        page = b.page
        held: list[Any] = []
        page.route("**/v1/analyze*", lambda route: held.append(route))  # the answer never comes
        page.goto(srv.url + "/")
        page.wait_for_function(MODELS_LISTED, timeout=20000)
        assert not page.locator("#cancel-btn").is_visible()
        b.pick(audio)
        page.wait_for_function("document.body.dataset.state === 'working'", timeout=10000)
        page.wait_for_function("document.getElementById('cancel-btn').hidden === false", timeout=10000)
        page.click("#cancel-btn")
        assert page.evaluate("document.body.dataset.state") == "idle"
        # the file input no longer names the cancelled file, and holds the focus the hidden button had
        assert page.evaluate("document.getElementById('file-input').value") == ""
        assert page.evaluate("document.activeElement.id") == "file-input"
        assert b.status().startswith("Cancelled."), b.status()
        assert not page.locator("#cancel-btn").is_visible()
        page.wait_for_function(
            "document.getElementById('noisy-audio').getAttribute('src') === null", timeout=5000
        )
        page.unroute("**/v1/analyze*")
        assert b.upload(audio) == "done", b.status()
        assert not page.locator("#cancel-btn").is_visible()
        assert not b.errors, b.errors
