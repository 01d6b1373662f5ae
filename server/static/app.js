// tim-enhance web page: upload or record, POST /v1/analyze?audio=wav (analysis and audio in one), play both, draw spectrograms
// (computed here: WebAudio decodeAudioData + a small radix-2 FFT) and the competition maps (canvas heatmaps).
// No build step, no dependencies. <body data-state> is idle | working | done | error (the tests wait on it).
"use strict";

const $ = (id) => document.getElementById(id);
const SPEC_RATE = 16000, FFT_SIZE = 512, HOP = 256, MAX_COLUMNS = 2400;
const FLOOR_DB = -100;  // the dB of a bin of zeros (the power's guard)
// what the browser converts to WAV at, for files the server cannot read and for recordings: the model runs at
// 16 kHz, so a higher rate gains nothing (the output is band-limited to 8 kHz), and 48 kHz made the WAV 3x larger
const CONVERT_RATE = 16000;
let objectUrls = [];
let recorder = null;
let runAbort = null;  // the run in progress; a newer run aborts it: its requests, and it stops at its next await
const READY_TEXT = "Choose a file to start.";
const LOADING_TEXT = "The server is loading its model; the list follows when it is ready…";

function setState(state, message) {
  document.body.dataset.state = state;
  if (message !== undefined) $("status").textContent = message;
}

function authHeaders() {
  const key = $("api-key").value.trim();
  // a header holds Latin-1 only: fetch threw a TypeError that read as "the server cannot be reached"
  if (/[^\x20-\x7e]/.test(key)) {
    throw new Error("the API key holds a character that cannot be sent (a pasted invisible space, or a letter " +
      "outside ASCII?): type it again");
  }
  return key ? { "X-API-Key": key } : {};
}

function keepUrl(blob) {
  const url = URL.createObjectURL(blob);
  objectUrls.push(url);
  return url;
}

async function errorText(resp) {
  // the server's words name HTTP headers; on this page the key goes in its field
  const hint = resp.status === 401 ? " (enter the key in the API key field above)" : "";
  try {
    const body = await resp.json();
    if (body && body.error) return `${body.error.message}${hint} (${resp.status} ${body.error.code})`;
  } catch (_) { /* not JSON */ }
  // every error of the service is JSON: a bare 5xx comes from the server stopping mid-request, or a proxy
  const stopped = resp.status >= 500 ? " (the server stopped or failed during the request; try again)" : "";
  return `${resp.status} ${resp.statusText}${hint}${stopped}`;
}

// what an exception means to the user: fetch rejects with a TypeError ("Failed to fetch") when no answer came
function errorMessage(err) {
  if (err instanceof TypeError && /fetch|network/i.test(err.message)) {
    return "the server cannot be reached (is it running, and is this its address?)";
  }
  return err.message;
}

async function errorCode(resp) {
  try { return (await resp.clone().json()).error.code; } catch (_) { return null; }
}

function retryAfter(resp) {
  return Math.min(10, Number(resp.headers.get("Retry-After")) || 1);
}

// POST with one retry loop on 503 (busy / loading), honouring Retry-After. `model`: the one chosen when the run
// started (the run and its retries use it, whatever the menu says later). `signal` aborts it (a newer run).
async function post(path, blob, name, model, signal) {
  const url = model ? `${path}${path.includes("?") ? "&" : "?"}model=${encodeURIComponent(model)}` : path;
  for (let attempt = 0; ; attempt++) {
    const form = new FormData();
    form.append("file", blob, name);
    const resp = await fetch(url, { method: "POST", body: form, headers: authHeaders(), signal });
    // a model that failed to load never comes back: its 503 is the answer, not "busy"
    if (resp.status !== 503 || attempt >= 4 || (await errorCode(resp)) === "model_unavailable") return resp;
    const wait = retryAfter(resp), before = $("status").textContent;
    setState("working", `Server busy, retrying in ${wait} s…`);
    await new Promise((r) => setTimeout(r, wait * 1000));
    signal.throwIfAborted();
    setState("working", before);  // the run's own status again, not "busy" through the retried request
  }
}

// ---------- audio decoding and WAV encoding ----------

async function decode(blob, rate) {
  const ctx = new OfflineAudioContext(1, 1, rate);
  return ctx.decodeAudioData(await blob.arrayBuffer());
}

function encodeWav(buffer) {
  const ch = buffer.numberOfChannels, n = buffer.length, rate = buffer.sampleRate;
  const out = new DataView(new ArrayBuffer(44 + n * ch * 2));
  const text = (off, s) => { for (let i = 0; i < s.length; i++) out.setUint8(off + i, s.charCodeAt(i)); };
  text(0, "RIFF"); out.setUint32(4, 36 + n * ch * 2, true); text(8, "WAVE"); text(12, "fmt ");
  out.setUint32(16, 16, true); out.setUint16(20, 1, true); out.setUint16(22, ch, true);
  out.setUint32(24, rate, true); out.setUint32(28, rate * ch * 2, true); out.setUint16(32, ch * 2, true);
  out.setUint16(34, 16, true); text(36, "data"); out.setUint32(40, n * ch * 2, true);
  const data = [];
  for (let c = 0; c < ch; c++) data.push(buffer.getChannelData(c));
  let off = 44;
  for (let i = 0; i < n; i++) {
    for (let c = 0; c < ch; c++) {
      const v = Math.max(-1, Math.min(1, data[c][i]));
      out.setInt16(off, v < 0 ? v * 32768 : v * 32767, true);
      off += 2;
    }
  }
  return new Blob([out], { type: "audio/wav" });
}

// ---------- spectrogram ----------

function fft(re, im) {  // in place, length a power of two
  const n = re.length;
  for (let i = 1, j = 0; i < n; i++) {
    let bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) { [re[i], re[j]] = [re[j], re[i]]; [im[i], im[j]] = [im[j], im[i]]; }
  }
  for (let len = 2; len <= n; len <<= 1) {
    const ang = -2 * Math.PI / len, wr = Math.cos(ang), wi = Math.sin(ang);
    for (let i = 0; i < n; i += len) {
      let cr = 1, ci = 0;
      for (let k = 0; k < len / 2; k++) {
        const a = i + k, b = a + len / 2;
        const tr = re[b] * cr - im[b] * ci, ti = re[b] * ci + im[b] * cr;
        re[b] = re[a] - tr; im[b] = im[a] - ti; re[a] += tr; im[a] += ti;
        const nr = cr * wr - ci * wi; ci = cr * wi + ci * wr; cr = nr;
      }
    }
  }
}

function spectrogram(samples) {  // -> {frames, bins, db: Float32Array [frames * bins]}
  const bins = FFT_SIZE / 2 + 1;
  const hop = Math.max(HOP, Math.ceil(samples.length / MAX_COLUMNS));
  const frames = Math.max(1, Math.floor((samples.length - FFT_SIZE) / hop) + 1);
  const win = new Float32Array(FFT_SIZE).map((_, i) => 0.5 - 0.5 * Math.cos(2 * Math.PI * i / FFT_SIZE));
  const db = new Float32Array(frames * bins);
  const re = new Float32Array(FFT_SIZE), im = new Float32Array(FFT_SIZE);
  for (let t = 0; t < frames; t++) {
    for (let i = 0; i < FFT_SIZE; i++) { re[i] = (samples[t * hop + i] || 0) * win[i]; im[i] = 0; }
    fft(re, im);
    for (let k = 0; k < bins; k++) db[t * bins + k] = 10 * Math.log10(re[k] * re[k] + im[k] * im[k] + 10 ** (FLOOR_DB / 10));
  }
  return { frames, bins, db };
}

const MAGMA = [[0, 0, 4], [81, 18, 124], [183, 55, 121], [252, 137, 97], [252, 253, 191]];
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function colour(map, v) {
  const x = Math.max(0, Math.min(1, v)) * (map.length - 1), i = Math.min(map.length - 2, Math.floor(x));
  const f = x - i, a = map[i], b = map[i + 1];
  return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])];
}

function drawImage(canvas, width, height, pixel) {  // pixel(x, y) -> [r, g, b], y = 0 at the bottom
  const off = document.createElement("canvas");
  off.width = width; off.height = height;
  const octx = off.getContext("2d"), img = octx.createImageData(width, height);
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const [r, g, b] = pixel(x, height - 1 - y), o = (y * width + x) * 4;
      img.data[o] = r; img.data[o + 1] = g; img.data[o + 2] = b; img.data[o + 3] = 255;
    }
  }
  octx.putImageData(img, 0, 0);
  return off;
}

// the smallest round step (s) of at least `raw` seconds: 3.5-s ticks on a minute were hard to read
function niceStep(raw) {
  for (const s of [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600]) if (s >= raw) return s;
  return Math.ceil(raw / 3600) * 3600;
}

// ticks and labels in seconds under a plot from x0 over `span` pixels; each label centred on its tick and kept
// inside the canvas ("10.0 s" at the right end was cut off)
function timeAxis(ctx, x0, span, duration, y, px) {
  const step = niceStep(duration / Math.max(2, Math.floor(span / (70 * px))));
  ctx.fillStyle = "#555";
  for (let t = 0; t <= duration + 1e-9; t += step) {
    const x = x0 + (span * t) / Math.max(duration, 1e-9), text = `${step < 1 ? t.toFixed(1) : t.toFixed(0)} s`;
    const w = ctx.measureText(text).width;
    ctx.fillRect(x, y, px, 4 * px);
    ctx.fillText(text, Math.max(0, Math.min(x - w / 2, ctx.canvas.width - w - px)), y + 15 * px);
  }
}

// drawn at the canvas' width on screen, with a kHz axis and a time axis (they had none: the top could have been
// 8 or 22 kHz); `duration` in seconds
function paintSpectrogram(canvas, spec, top, duration) {
  const { frames, bins, db } = spec;
  const px = window.devicePixelRatio || 1;
  canvas.width = Math.round(Math.max(canvas.clientWidth || 600, 240) * px);
  canvas.height = Math.round(200 * px);
  const ctx = canvas.getContext("2d"), left = 46 * px, bottom = 20 * px, pad = 6 * px;
  const w = canvas.width - left - pad, h = canvas.height - bottom - pad;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const img = drawImage(canvas, frames, bins, (x, y) => colour(MAGMA, (db[x * bins + y] - top + 80) / 80));
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(img, left, pad, w, h);
  ctx.font = `${11 * px}px system-ui, sans-serif`;
  ctx.fillStyle = "#555";
  const nyquist = SPEC_RATE / 2000;
  for (let khz = 0; khz <= nyquist; khz += 2) {
    const y = pad + h - (h * khz) / nyquist, text = `${khz} kHz`;
    ctx.fillRect(left - 4 * px, y, 4 * px, px);
    ctx.fillText(text, left - 6 * px - ctx.measureText(text).width, Math.max(y + 4 * px, 10 * px));
  }
  timeAxis(ctx, left, w, duration, pad + h, px);
}

// Both on one dB scale (the noisy input's peak = top of the colour map), so they can be compared. Each is drawn
// if this browser decodes it (the server reads AIFF and AU, Chromium does not); returns a note for the status
// naming what could not be drawn ("" when both were).
let lastSpectra = null;  // kept to redraw at a new width (they were shrunk, axis labels and all)
function paintSpectra() {
  const { a, b, top, seconds } = lastSpectra;
  if (a) paintSpectrogram($("noisy-spectrogram"), a, top, seconds[0]);
  if (b) paintSpectrogram($("enhanced-spectrogram"), b, top, seconds[1]);
}
async function drawSpectrograms(noisyBlob, enhancedBlob, isCurrent) {
  const decoded = await Promise.allSettled([decode(noisyBlob, SPEC_RATE), decode(enhancedBlob, SPEC_RATE)]);
  if (!isCurrent()) return "";
  const [a, b] = decoded.map((d) => (d.status === "fulfilled" ? spectrogram(d.value.getChannelData(0)) : null));
  // the top is at least 80 dB over the floor of a bin of zeros: a silent input's own peak is that floor, and
  // relative to it everything (its zeros, the output's least sample) was drawn brightest
  let top = FLOOR_DB + 80;
  for (const v of (a || b || { db: [] }).db) top = Math.max(top, v);
  const seconds = decoded.map((d) => (d.status === "fulfilled" ? d.value.duration : 0));
  lastSpectra = { a, b, top, seconds };
  paintSpectra();
  const missing = [a ? "" : "input", b ? "" : "output"].filter(Boolean);
  return missing.length ? ` This browser cannot decode the ${missing.join(" or ")}: no spectrogram (nor playback) of it.` : "";
}

// ---------- competition maps ----------

// Drawn at the canvas' own width on screen (and the screen's pixel density): a fixed 1200-pixel drawing shrunk
// to a phone's width left 3-pixel labels and 5-pixel rows. Redrawn when the window's width changes. Mechanism 0
// is each block's top row, as in the summary table (it was the bottom one), each row is labelled, and a colour
// bar says what bright means.
let lastAnalysis = null;
function drawCompetition(canvas, analysis) {
  lastAnalysis = analysis;
  const px = window.devicePixelRatio || 1;
  canvas.width = Math.round(Math.max(canvas.clientWidth || 600, 240) * px);
  const ctx = canvas.getContext("2d"), label = 84 * px, rowH = 18 * px, gap = 10 * px, axis = 18 * px;
  const legend = 18 * px;
  const blocks = analysis.blocks;
  const mechanisms = (b) => (b.maps.length ? b.maps[0].length : analysis.n_mechanisms);
  canvas.height = Math.max(40, blocks.reduce((h, b) => h + mechanisms(b) * rowH + gap, 0) + gap + axis + legend);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#333";
  ctx.font = `${12 * px}px system-ui, sans-serif`;
  if (!blocks.length) { ctx.fillText("this model has no competition maps", 10 * px, 24 * px); return; }
  let y = gap;
  for (const block of blocks) {
    const frames = block.maps.length, ns = mechanisms(block);
    // drawImage's rows count from the bottom: mechanism k at row ns - 1 - k puts mechanism 0 on top
    const img = drawImage(canvas, Math.max(1, frames), ns, (x, r) => colour(VIRIDIS, frames ? block.maps[x][ns - 1 - r] : 0));
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(img, label, y, canvas.width - label - 4 * px, ns * rowH);
    ctx.fillStyle = "#333";
    ctx.fillText(`block ${block.block}`, 4 * px, y + (ns * rowH) / 2 + 4 * px);
    ctx.fillStyle = "#666";
    for (let k = 0; k < ns; k++) {
      const text = `m${k}`;
      ctx.fillText(text, label - 4 * px - ctx.measureText(text).width, y + k * rowH + rowH / 2 + 4 * px);
    }
    y += ns * rowH + gap;
  }
  timeAxis(ctx, label, canvas.width - label - 4 * px, analysis.duration_s, y - gap + 2 * px, px);
  // the colour bar: score 0 (loses the frame) to 1 (wins it)
  const barW = 90 * px, barY = y + axis - 2 * px, barX = canvas.width - barW - 90 * px;
  for (let i = 0; i < barW; i++) {
    const [r, g, b] = colour(VIRIDIS, i / (barW - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(barX + i, barY, 1, 10 * px);
  }
  ctx.fillStyle = "#555";
  ctx.fillText("score 0", barX - ctx.measureText("score 0").width - 4 * px, barY + 9 * px);
  ctx.fillText("1 (wins)", barX + barW + 4 * px, barY + 9 * px);
}
let drawnWidth = window.innerWidth;
window.addEventListener("resize", () => {
  if (window.innerWidth === drawnWidth) return;
  drawnWidth = window.innerWidth;
  if (lastAnalysis) drawCompetition($("competition-canvas"), lastAnalysis);
  if (lastSpectra) paintSpectra();
});

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function showSummary(a) {
  const rows = a.blocks.map((b) =>
    `<tr><td>${b.block}</td><td>${b.mean_entropy.toFixed(3)} of ${b.max_entropy.toFixed(3)}</td>` +
    `<td>${b.win_share.map((w) => (100 * w).toFixed(0) + "%").join(" · ")}</td></tr>`).join("");
  const names = Array.from({ length: a.n_mechanisms }, (_, k) => `m${k}`).join(" · ");
  const level = (v) => (v === null ? "silent" : `${v.toFixed(1)} dBFS`);
  $("analysis-summary").innerHTML =
    `<p>Model <b>${escapeHtml(a.model)}</b>, ${a.duration_s.toFixed(2)} s at ${a.sample_rate} Hz, ${a.channels} channel(s); ` +
    `input ${level(a.input_rms_dbfs)}, output ${level(a.output_rms_dbfs)}.</p>` +
    (rows ? `<table><caption>Competition per TIM block</caption><tr><th>block</th><th>mean entropy, nats (of at most ln ${a.n_mechanisms}: no preference)</th>` +
      `<th>frames won by ${names}</th></tr>${rows}</table>` : "");
}

// ---------- the flow ----------

// Nothing of an earlier file stays on screen once a new one starts (nor after its error).
function clearResults() {
  objectUrls.forEach((u) => URL.revokeObjectURL(u));
  objectUrls = [];
  for (const id of ["noisy-audio", "enhanced-audio"]) { $(id).pause(); $(id).removeAttribute("src"); $(id).load(); }
  $("download-link").hidden = true;
  $("download-link").removeAttribute("href");
  for (const id of ["noisy-spectrogram", "enhanced-spectrogram", "competition-canvas"]) {
    const c = $(id);
    c.getContext("2d").clearRect(0, 0, c.width, c.height);
  }
  $("analysis-summary").innerHTML = "";
  lastAnalysis = null;
  lastSpectra = null;
}

async function run(blob, name) {
  if (runAbort) runAbort.abort();
  const abort = new AbortController();
  runAbort = abort;
  const isCurrent = () => !abort.signal.aborted;
  const check = () => abort.signal.throwIfAborted();  // after every await
  clearResults();
  setState("working", `Enhancing ${name}…`);
  $("cancel-btn").hidden = false;
  $("noisy-audio").src = keepUrl(blob);
  const model = $("model-select").value;
  let converted = false;
  try {
    // one request, one run of the model: the analysis and the enhanced WAV come back as the parts of one form
    const route = "v1/analyze?audio=wav";
    let resp = await post(route, blob, name, model, abort.signal);
    check();
    // a container or codec libsndfile cannot read (m4a, webm, mp3 on old libsndfile): the browser may decode it
    if (resp.status === 422 && (await errorCode(resp)) === "unsupported_format") {
      check();
      let wav = null;
      try { wav = encodeWav(await decode(blob, CONVERT_RATE)); } catch (_) { /* keep the server's answer */ }
      check();
      if (wav) {
        blob = wav;
        name = name.replace(/\.[^.]*$/, "") + ".wav";
        converted = true;
        $("noisy-audio").src = keepUrl(blob);
        resp = await post(route, blob, name, model, abort.signal);
        check();
      }
    }
    if (!resp.ok) {
      const why = await errorText(resp);
      const size = `${(blob.size / 2 ** 20).toFixed(1)} MiB`;
      throw new Error(converted ? `${why} (the server could not read the file, so this browser converted it to a ${size} WAV)` : why);
    }
    const seconds = Number(resp.headers.get("X-Processing-Seconds")).toFixed(2);
    const form = await resp.formData();
    check();
    const analysis = JSON.parse(form.get("analysis"));  // a part without a file name is a string
    const enhanced = new Blob([form.get("audio")], { type: "audio/wav" });
    check();
    const url = keepUrl(enhanced);
    $("enhanced-audio").src = url;
    const link = $("download-link");
    link.href = url; link.download = name.replace(/\.[^.]*$/, "") + ".enhanced.wav"; link.hidden = false;
    link.setAttribute("aria-label", `download ${link.download}`);  // not just "download"
    setState("working", `Enhanced in ${seconds} s; drawing…`);
    // caught here, at once: a rejection left waiting was reported as uncaught
    const spectra = drawSpectrograms(blob, enhanced, isCurrent).catch((e) => {
      console.warn("spectrogram:", e);
      return " The spectrograms could not be drawn.";
    });
    drawCompetition($("competition-canvas"), analysis);
    showSummary(analysis);
    const note = await spectra;
    check();
    const how = converted ? " The server could not read the original, so this browser sent it as a 16 kHz WAV (the output is 16 kHz)." : "";
    // what the CLI prints as warnings (digital silence, audio that ends before its header's length)
    const warned = analysis.warnings.length ? ` Warning: ${analysis.warnings.join("; ")}.` : "";
    setState("done", `Done: ${name} (${analysis.duration_s.toFixed(2)} s) enhanced in ${seconds} s.${warned}${how}${note}${stillRecording()}`);
  } catch (err) {
    if (!isCurrent()) return;  // a newer run (or Cancel) owns the page
    setState("error", `Error: ${errorMessage(err)}${stillRecording()}`);
  } finally {
    if (isCurrent()) {
      if (document.activeElement === $("cancel-btn")) $("file-input").focus();  // not lost with the button
      $("cancel-btn").hidden = true;
    }
  }
}

// a long file could be stopped only by picking another one: Cancel aborts the run's requests (the server stops
// the job of a client that goes away) and leaves the page ready for the next file
function cancelRun() {
  if (!runAbort) return;
  runAbort.abort();
  runAbort = null;
  $("cancel-btn").hidden = true;
  clearResults();
  $("file-input").value = "";  // it still named the cancelled file beside "Choose a file to start"
  $("file-input").focus();  // the hidden Cancel button held the keyboard focus: it fell to the page
  setState("idle", `Cancelled. ${READY_TEXT}${stillRecording()}`);
}

// a run that ends while the microphone records must not leave "Done" as the last word: the mic is still live
function stillRecording() {
  return recorder && recorder.state === "recording" ? " (Recording continues: press Stop when done.)" : "";
}

async function loadModels() {
  try {
    const resp = await fetch("v1/models", { headers: authHeaders() });
    if (resp.status === 503 && (await errorCode(resp)) === "model_unavailable") {
      // loading failed, for good: say so (it was "loading" forever, and wiped an upload's error each second)
      setState("error", `Models: ${await errorText(resp)}; the server must be restarted`);
      return;
    }
    if (resp.status === 503) {  // still loading: ask again (an error here stayed on screen for good)
      if (["idle", "error", undefined].includes(document.body.dataset.state)) setState("idle", LOADING_TEXT);
      setTimeout(loadModels, retryAfter(resp) * 1000);
      return;
    }
    if (!resp.ok) { setState("error", `Models: ${await errorText(resp)}`); return; }
    const select = $("model-select");
    const chosen = select.value;  // kept when the list is loaded again (a new API key), if the model is still there
    const models = (await resp.json()).models;
    select.innerHTML = "";
    for (const m of models) {
      const opt = document.createElement("option");
      opt.value = m.name;
      opt.textContent = `${m.name} (${m.n_mechanisms} mech., ${(m.parameters / 1e6).toFixed(2)}M)`;
      opt.selected = models.some((x) => x.name === chosen) ? m.name === chosen : m.default;
      select.appendChild(opt);
    }
    // the key works now: an error on screen (this list's 401, or an upload's) is no longer the state of things
    if (document.body.dataset.state === "error" || $("status").textContent === LOADING_TEXT) setState("idle", READY_TEXT);
  } catch (err) {
    setState("error", `Models: ${errorMessage(err)}`);
  }
}

async function startRecording() {
  // disabled at once, before the permission prompt: a second click while it was open opened a second
  // microphone stream, whose recorder was then forgotten and kept the microphone on after Stop
  $("record-btn").disabled = true;
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const chunks = [];
    const rec = new MediaRecorder(stream);
    recorder = rec;
    rec.ondataavailable = (e) => chunks.push(e.data);
    rec.onstop = async () => {
      stream.getTracks().forEach((t) => t.stop());
      $("record-btn").disabled = false; $("stop-btn").disabled = true;
      $("record-btn").focus();  // the focused Stop is disabled now: keep keyboard users in place
      let wav;
      try {  // MediaRecorder gives webm/ogg-opus; send WAV, which the server always reads
        wav = encodeWav(await decode(new Blob(chunks, { type: rec.mimeType }), CONVERT_RATE));
      } catch (err) {
        clearResults();  // nothing of an earlier file stays on screen under this error
        setState("error", `Recording: nothing could be decoded (${err.message}); record for a moment longer.`);
        return;
      }
      await run(wav, "recording.wav");
    };
    rec.start();
    $("stop-btn").disabled = false;
    $("stop-btn").focus();
    setState("working", "Recording… press Stop when done.");
  } catch (err) {
    $("record-btn").disabled = false;
    $("record-btn").focus();  // it was disabled while focused: keyboard users fell back to the page's start
    setState("error", `Microphone: ${err.message}`);
  }
}

// cleared as the chooser opens, so that picking the same file again is a change too (and runs again); cleared
// in the change handler, the input said "No file chosen" beside the file it was enhancing
$("file-input").addEventListener("click", (e) => { e.target.value = ""; });
$("file-input").addEventListener("change", (e) => {
  const file = e.target.files[0];
  if (file) run(file, file.name);
});
// browsers give pages the microphone only in a secure context (HTTPS, or localhost): elsewhere (a LAN address
// over plain HTTP) navigator.mediaDevices is missing, and Record failed with "reading 'getUserMedia'"
const canRecord = Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);
if (!canRecord) {
  $("record-btn").disabled = true;
  $("record-note").hidden = false;
}
$("record-btn").addEventListener("click", startRecording);
$("cancel-btn").addEventListener("click", cancelRun);
$("stop-btn").addEventListener("click", () => recorder && recorder.state !== "inactive" && recorder.stop());
$("api-key").addEventListener("change", loadModels);
setState("idle", READY_TEXT);  // the page's own text says "Loading…" until this script runs
loadModels();
