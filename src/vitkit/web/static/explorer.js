// vitkit explore: the page. Plain JavaScript, no framework, no build step, nothing from a CDN.
// Every number shown comes from the server (vitkit.explain); this file fetches, decodes and draws.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const $ = (id) => document.getElementById(id);
const S = {
  model: null, view: null, sampleId: null, heads: null, fused: null, layer: 0, head: "0",
  overlay: null, query: null, methods: {}, selectedMethod: null, stats: null, causal: null,
};

// ------------------------------------------------------------------------------ helpers
function status(text, error) {
  const el = $("status");
  el.textContent = text || "";
  el.className = error ? "error" : "";
}

async function api(path, params = {}, init = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const headers = Object.assign({ "X-Vitkit-Token": TOKEN }, init.headers || {});
  const response = await fetch(url, Object.assign({}, init, { headers }));
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    status(message, true);
    throw new Error(message);
  }
  return init.raw ? response : response.json();
}

function decode(enc) {  // {"shape", "b64"} -> {data: Float32Array, shape}
  const bytes = Uint8Array.from(atob(enc.b64), (c) => c.charCodeAt(0));
  return { data: new Float32Array(bytes.buffer), shape: enc.shape };
}

function slice2d(arr, offset, h, w) {
  return { data: arr.data.subarray(offset, offset + h * w), h, w };
}

// inferno-like colour map: 0 (dark) .. 1 (bright)
const STOPS = [[0, 0, 4], [40, 11, 84], [101, 21, 110], [159, 42, 99], [212, 72, 66],
  [245, 125, 21], [250, 193, 39], [252, 255, 164]];
function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i;
  return STOPS[i].map((a, k) => Math.round(a + f * (STOPS[i + 1][k] - a)));
}

function mapCanvas(map, alpha) {  // {data, h, w} -> a w x h canvas, min-max normalised
  let lo = Infinity, hi = -Infinity;
  for (const v of map.data) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const span = hi - lo || 1;
  const c = document.createElement("canvas");
  c.width = map.w; c.height = map.h;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(map.w, map.h);
  map.data.forEach((v, i) => {
    const [r, g, b] = colour((v - lo) / span);
    img.data.set([r, g, b, Math.round(alpha * 255)], 4 * i);
  });
  ctx.putImageData(img, 0, 0);
  return c;
}

let PICTURE = null;  // the input as the model sees it, on a canvas of its own size
function pictureCanvas(pic) {
  const [h, w] = pic.shape;
  const bytes = Uint8Array.from(atob(pic.b64), (c) => c.charCodeAt(0));
  const c = document.createElement("canvas");
  c.width = w; c.height = h;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(w, h);
  for (let i = 0; i < w * h; i++) img.data.set([bytes[3 * i], bytes[3 * i + 1], bytes[3 * i + 2], 255], 4 * i);
  ctx.putImageData(img, 0, 0);
  return c;
}

function fitCanvas(canvas, longest) {
  const [h, w] = S.model.input;
  const scale = longest / Math.max(h, w);
  canvas.width = Math.round(w * scale); canvas.height = Math.round(h * scale);
}

function drawFigure(canvas, map, opts = {}) {  // picture + map overlay (+ grid, box, patch)
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (!PICTURE) return;
  ctx.imageSmoothingEnabled = PICTURE.width >= canvas.width / 2;
  ctx.drawImage(PICTURE, 0, 0, canvas.width, canvas.height);
  if (map) {
    ctx.imageSmoothingEnabled = true;
    ctx.drawImage(mapCanvas(map, opts.alpha ?? Number($("opacity").value)), 0, 0, canvas.width, canvas.height);
  }
  const [gh, gw] = S.model.grid, sx = canvas.width / gw, sy = canvas.height / gh;
  if (opts.grid) {
    ctx.strokeStyle = "rgba(255,255,255,0.5)"; ctx.lineWidth = 1;
    for (let i = 1; i < gw; i++) { ctx.beginPath(); ctx.moveTo(i * sx, 0); ctx.lineTo(i * sx, canvas.height); ctx.stroke(); }
    for (let i = 1; i < gh; i++) { ctx.beginPath(); ctx.moveTo(0, i * sy); ctx.lineTo(canvas.width, i * sy); ctx.stroke(); }
  }
  if (opts.box && S.view && S.view.box) {
    const [h, w] = S.model.input, [x0, y0, x1, y1] = S.view.box;
    ctx.strokeStyle = "#00e676"; ctx.lineWidth = 2;
    ctx.strokeRect(x0 * canvas.width / w, y0 * canvas.height / h, (x1 - x0) * canvas.width / w, (y1 - y0) * canvas.height / h);
  }
  if (opts.patch !== undefined && opts.patch !== null) {
    const r = Math.floor(opts.patch / gw), c = opts.patch % gw;
    ctx.strokeStyle = "#00b0ff"; ctx.lineWidth = 2;
    ctx.strokeRect(c * sx, r * sy, sx, sy);
  }
}

function headMap(layer, head) {  // from the layers x heads model view, or the fused column
  if (!S.heads) return null;
  const [L, H, gh, gw] = S.heads.shape;
  if (["mean", "max", "min"].includes(String(head))) {
    return S.fused && S.fused.name === head ? slice2d(S.fused, layer * gh * gw, gh, gw) : null;
  }
  return slice2d(S.heads, (layer * H + Number(head)) * gh * gw, gh, gw);
}

function download(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob); a.download = name;
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

// --------------------------------------------------------------------------- the figure
function drawMain() {
  const patch = S.query !== null && S.query >= S.model.prefix_tokens.length ? S.query - S.model.prefix_tokens.length : null;
  drawFigure($("main"), S.overlay ? S.overlay.map : null,
    { grid: $("show-grid").checked, box: $("show-box").checked, patch });
  $("overlay-title").textContent = S.overlay ? S.overlay.title : (S.view ? S.view.label : "no image yet");
}

const quietly = (promise) => promise.catch(() => {});  // the status line already says why

function showHead(layer, head) {
  S.layer = layer; S.head = String(head);
  $("layer").value = String(layer); $("head").value = String(head);
  if (!S.view) return;
  const map = headMap(layer, head);
  if (map) S.overlay = { kind: "head", map, title: `layer ${layer}, head ${head}: where the readout looks` };
  document.querySelectorAll("#mosaic canvas").forEach((c) =>
    c.classList.toggle("selected", c.dataset.layer === String(layer) && c.dataset.head === String(head)));
  drawMain();
  if (S.query !== null) quietly(loadToken(S.query));
  if (S.methods.cls) quietly(loadMethods(["cls"]));
}

function drawMosaic() {
  const box = $("mosaic");
  box.innerHTML = "";
  if (!S.heads) return;
  const [L, H] = S.heads.shape, extra = S.fused ? 1 : 0;
  box.style.gridTemplateColumns = `2.5em repeat(${H + extra}, 1fr)`;
  for (let l = 0; l < L; l++) {
    const label = document.createElement("div");
    label.className = "rowlabel"; label.textContent = `L${l}`;
    box.appendChild(label);
    const heads = [...Array(H).keys()].map(String).concat(extra ? [S.fused.name] : []);
    for (const h of heads) {
      const c = document.createElement("canvas");
      fitCanvas(c, 64);
      c.dataset.layer = String(l); c.dataset.head = h;
      c.title = `layer ${l}, head ${h}`;
      drawFigure(c, headMap(l, h), { alpha: 0.75 });
      c.addEventListener("click", () => showHead(l, h));
      box.appendChild(c);
    }
  }
}

// ----------------------------------------------------------------------------- images
async function showView(v) {
  S.view = v; S.query = null; S.methods = {}; S.selectedMethod = null; S.stats = null; S.causal = null;
  if (!S.keepTarget) $("target").value = "";  // a new image: explain its own prediction
  PICTURE = pictureCanvas(v.picture);
  S.heads = decode(v.heads); S.fused = null;
  const fusion = $("fusion-column").value;
  if (fusion) await loadFused(fusion);
  $("top5").innerHTML = "";
  if (!S.model.has_classifier) $("top5").textContent = "this checkpoint has no classifier head (features only): no classes to show or explain";
  for (const t of v.top) {
    const li = document.createElement("li");
    li.textContent = `${t.name} ${(100 * t.prob).toFixed(1)}%`;
    const bar = document.createElement("span");
    bar.className = "bar"; bar.style.width = `${Math.round(100 * t.prob)}px`;
    li.appendChild(bar);
    $("top5").appendChild(li);
  }
  drawMosaic();
  showHead(S.model.depth - 1, "0");
  $("token-caption").textContent = "click a patch on the image";
  for (const id of ["token-row", "token-rollout", "faith-plot", "lens-plot"]) {
    const c = $(id); c.getContext("2d").clearRect(0, 0, c.width, c.height);
  }
  $("faith-text").textContent = ""; $("lens-text").textContent = ""; $("importance-table").innerHTML = "";
  status("");
  await loadMethods();
  await loadStats();
}

async function upload(file) {
  status(`reading ${file.name} ...`);
  S.sampleId = null;
  const v = await api("/api/image", {}, { method: "POST", body: file, headers: { "Content-Type": "application/octet-stream" } });
  v.label = file.name;
  await showView(v);
}

async function pickSample(id) {
  if (id === "") return;
  status("reading the sample ...");
  S.sampleId = Number(id);
  $("samples").value = String(id);
  await showView(await api("/api/sample", { id }, { method: "POST" }));
}

async function loadFused(name) {
  const r = await api("/api/heads", { image: S.view.image, fusion: name });
  S.fused = Object.assign(decode(r.map), { name });
}

// ------------------------------------------------------------------------------ tokens
function patchAt(event) {
  const c = $("main"), rect = c.getBoundingClientRect();
  const [gh, gw] = S.model.grid;
  const col = Math.min(gw - 1, Math.floor((event.clientX - rect.left) / rect.width * gw));
  const row = Math.min(gh - 1, Math.floor((event.clientY - rect.top) / rect.height * gh));
  return S.model.prefix_tokens.length + row * gw + col;
}

async function loadToken(token) {
  if (!S.view) return;
  S.query = token;
  $("query").value = String(token);
  const r = await api("/api/token", Object.assign({ image: S.view.image, query: token }, methodParams()));
  const [gh, gw] = S.model.grid, p = S.model.prefix_tokens.length;
  const row = decode(r.row), roll = decode(r.rollout);
  drawFigure($("token-row"), slice2d(row, p, gh, gw), { patch: token >= p ? token - p : null });
  drawFigure($("token-rollout"), slice2d(roll, p, gh, gw), { patch: token >= p ? token - p : null });
  const name = token < p ? S.model.prefix_tokens[token] : `patch (row ${Math.floor((token - p) / gw)}, column ${(token - p) % gw})`;
  $("token-caption").textContent = `${name}: attention at layer ${S.layer}, head ${S.head}`;
  const shares = S.model.prefix_tokens.map((n, i) => `${n} ${(100 * row.data[i]).toFixed(1)}%`);
  $("prefix-share").textContent = shares.length ? `share of this row on the prefix tokens: ${shares.join(", ")}` : "this model has no prefix tokens";
  drawMain();
}

// ----------------------------------------------------------------------------- methods
function methodParams() {
  return {
    layer: S.layer, head: S.head, residual: $("residual").value, discard: $("discard").value,
    fusion: $("fusion").value, target: $("target").value,
  };
}

function buildMethods() {
  const box = $("methods");
  box.innerHTML = "";
  for (const [name, summary] of Object.entries(S.model.methods)) {
    const fig = document.createElement("figure");
    fig.id = `method-${name}`;
    const c = document.createElement("canvas");
    c.width = 160; c.height = 160;
    const cap = document.createElement("figcaption");
    const reason = S.model.unavailable[name];
    if (reason) {
      fig.className = "unavailable";
      cap.textContent = `${name}: not available: ${reason}`;
      fig.title = reason;
    } else {
      cap.textContent = `${name}: ${summary}`;
      c.addEventListener("click", () => selectMethod(name));
    }
    fig.append(c, cap);
    box.appendChild(fig);
  }
  $("faith-method").innerHTML = "";
  for (const name of S.model.applicable) $("faith-method").add(new Option(name, name));
}

function selectMethod(name) {
  const m = S.methods[name];
  if (!m) return;
  S.selectedMethod = name;
  document.querySelectorAll("#methods figure").forEach((f) => f.classList.toggle("selected", f.id === `method-${name}`));
  S.overlay = { kind: "method", map: m.map, title: m.target_name === null ? name : `${name} for class ${m.target_name}` };
  $("faith-method").value = name;
  drawMain();
}

async function loadMethods(names) {
  if (!S.view) return;
  for (const name of names || S.model.applicable) {
    status(`computing ${name} ...`);
    const r = await api("/api/method", Object.assign({ image: S.view.image, method: name }, methodParams()));
    const [gh, gw] = S.model.grid;
    S.methods[name] = { map: { data: decode(r.map).data, h: gh, w: gw }, target_name: r.target_name };
    const fig = $(`method-${name}`);
    drawFigure(fig.querySelector("canvas"), S.methods[name].map, { box: true });
    const what = r.target_name === null ? "" : ` (class ${r.target_name})`;
    fig.querySelector("figcaption").textContent = `${name}${what}: ${S.model.methods[name]}`;
    if (S.selectedMethod === name) selectMethod(name);
  }
  status("");
}

// ------------------------------------------------------------------------ faithfulness
function plotCurves(canvas, panels) {  // panels: [{title, series: [{name, ys, colour}]}]
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const pw = canvas.width / panels.length;
  panels.forEach((panel, k) => {
    const x0 = k * pw + 35, y0 = 20, w = pw - 50, h = canvas.height - 45;
    ctx.strokeStyle = "#999"; ctx.strokeRect(x0, y0, w, h);
    ctx.fillStyle = "#222"; ctx.font = "12px sans-serif";
    ctx.fillText(panel.title, x0, 14);
    ctx.fillText("0", x0 - 12, y0 + h); ctx.fillText("1", x0 - 12, y0 + 8);
    ctx.fillText(panel.xlabel || "", x0 + w / 3, y0 + h + 15);
    panel.series.forEach((s, j) => {
      ctx.strokeStyle = s.colour; ctx.lineWidth = 2; ctx.beginPath();
      s.ys.forEach((y, i) => {
        const px = x0 + w * (s.xs ? s.xs[i] : i / (s.ys.length - 1)), py = y0 + h * (1 - y);
        if (i === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
      });
      ctx.stroke();
      ctx.fillStyle = s.colour; ctx.fillText(s.name, x0 + 6, y0 + 14 + 14 * j);
    });
  });
}

async function runFaithfulness() {
  if (!S.view) return;
  const method = $("faith-method").value;
  status(`deleting and inserting patches by ${method} ...`);
  const r = await api("/api/faithfulness", Object.assign({ image: S.view.image }, methodParams(), { method }));
  const series = (key) => [
    { name: `${method} (AUC ${r[key + "_auc"][0].toFixed(3)})`, ys: r[key][0], xs: r.fractions, colour: "#d50000" },
    { name: `random (AUC ${r[key + "_auc"][1].toFixed(3)})`, ys: r[key][1], xs: r.fractions, colour: "#757575" },
  ];
  plotCurves($("faith-plot"), [
    { title: "deletion: p(class) as patches are removed", series: series("deletion"), xlabel: "fraction removed" },
    { title: "insertion: p(class) as patches return", series: series("insertion"), xlabel: "fraction revealed" },
  ]);
  const beaten = Math.round(r.percentile * r.random_maps);
  const rand = r.randomisation, cls = r.class_sensitivity;
  const trusted = r.percentile >= 0.9 && rand.passes && cls.passes;
  $("faith-text").textContent = `${method}, class ${S.model.classes[r.target]}: deletion AUC ${r.deletion_auc[0].toFixed(3)} (one random map ${r.deletion_auc[1].toFixed(3)}), insertion AUC ${r.insertion_auc[0].toFixed(3)}. ` +
    `Beats ${beaten} of ${r.random_maps} random maps on deletion (p ${r.p_value.toFixed(2)}). ` +
    `Model randomisation: ${rand.passes ? "passes" : "fails"} (rank correlation ${rand.correlation.toFixed(2)} once every block is re-initialised). ` +
    `Class sensitivity: ${cls.passes ? "passes" : "fails"} (correlation ${cls.correlation.toFixed(2)} with the least likely class's map). ` +
    (trusted ? "Trust it for this image." : "Trust it less: it fails at least one check a random or model-blind map would fail.");
  status("");
}

// ------------------------------------------------------------------------ heat tables
function heatTable(el, arr, fmt, onClick, selected) {
  const [L, H] = arr.shape;
  let lo = Infinity, hi = -Infinity;
  for (const v of arr.data) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const table = document.createElement("table");
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  for (let h = 0; h < H; h++) { const th = document.createElement("th"); th.textContent = `h${h}`; head.appendChild(th); }
  for (let l = 0; l < L; l++) {
    const tr = table.insertRow();
    const th = document.createElement("th"); th.textContent = `L${l}`; tr.appendChild(th);
    for (let h = 0; h < H; h++) {
      const v = arr.data[l * H + h], td = tr.insertCell();
      const [r, g, b] = colour((v - lo) / ((hi - lo) || 1));
      td.style.background = `rgb(${r},${g},${b})`;
      td.style.color = (v - lo) / ((hi - lo) || 1) > 0.6 ? "#000" : "#fff";
      td.textContent = fmt(v);
      td.title = `layer ${l}, head ${h}: ${fmt(v)}`;
      td.dataset.layer = String(l); td.dataset.head = String(h);
      td.addEventListener("click", () => onClick(l, h));
    }
  }
  el.innerHTML = ""; el.appendChild(table);
}

async function loadStats() {
  const r = await api("/api/stats", { image: S.view.image });
  S.stats = r;
  heatTable($("entropy-table"), decode(r.entropy), (v) => v.toFixed(2), showHead);
  heatTable($("distance-table"), decode(r.distance), (v) => v.toFixed(1), showHead);
  $("entropy-caption").textContent = `attention entropy (nats; uniform rows: ${r.max_entropy.toFixed(2)})`;
  $("distance-caption").textContent = `mean attention distance (pixels; uniform attention: ${r.uniform_distance.toFixed(1)})`;
  const names = S.model.prefix_tokens, p = names.length, gw = S.model.grid[1];
  const tokenName = (t) => (t < p ? names[t] : `patch ${t - p} (row ${Math.floor((t - p) / gw)}, column ${(t - p) % gw})`);
  const last = r.outliers.filter((o) => o.layer === S.model.depth - 1);
  $("outliers").textContent = r.outliers.length
    ? `High-norm tokens (Darcet et al. 2023; norm above median + 8 MAD): ${r.outliers.length} across layers; last layer: ${last.map((o) => `${tokenName(o.token)} (${o.norm.toFixed(1)} vs median ${o.median.toFixed(1)})`).join(", ") || "none"}.`
    : "No token has an outlying norm in any layer (no high-norm artifact tokens).";
}

// ------------------------------------------------------------------------------ causal
async function runCausal() {
  if (!S.view) return;
  status("zeroing each head in turn ...");
  const r = await api("/api/causal", { image: S.view.image, target: $("target").value, measure: $("measure").value });
  S.causal = r;
  const name = S.model.classes[r.target];
  plotCurves($("lens-plot"), [{ title: `p(${name}) after each layer`, xlabel: "layer",
    series: [{ name: "logit lens", ys: r.lens_prob, colour: "#2962ff" }] }]);
  const formed = r.lens_top.findIndex((c, i) => r.lens_top.slice(i).every((d) => d === r.target));
  $("lens-text").textContent = `Top class after each layer: ${r.lens_top_names.join(", ")}. ` +
    (formed >= 0 ? `${name} is the top class from layer ${formed} on.` : `${name} never becomes the top class.`);
  heatTable($("importance-table"), decode(r.importance), (v) => v.toFixed(2), showHead);
  status("");
}

// ------------------------------------------------------------------------------ export
function settings() {
  return {
    vitkit_explore: 1, model: S.model.name, sample: S.sampleId, image: S.view ? S.view.image : null,
    layer: S.layer, head: S.head, fusion_column: $("fusion-column").value, query_token: S.query,
    overlay: S.overlay ? S.overlay.kind : null, method: S.selectedMethod, target: $("target").value,
    residual: Number($("residual").value), discard_ratio: Number($("discard").value), rollout_fusion: $("fusion").value,
    opacity: Number($("opacity").value), patch_grid: $("show-grid").checked, box: $("show-box").checked,
    faithfulness_method: $("faith-method").value, measure: $("measure").value,
  };
}

async function applySettings(s) {
  $("fusion-column").value = s.fusion_column || ""; $("target").value = s.target || "";
  $("residual").value = s.residual ?? 0.5; $("discard").value = s.discard_ratio ?? 0;
  $("fusion").value = s.rollout_fusion || "mean"; $("opacity").value = s.opacity ?? 0.6;
  $("show-grid").checked = !!s.patch_grid; $("show-box").checked = s.box !== false;
  $("measure").value = s.measure || "logit";
  syncOutputs();
  S.keepTarget = true;
  try {
    if (s.sample !== null && s.sample !== undefined) await pickSample(String(s.sample));
    else if (s.image) { const v = await api("/api/view", { image: s.image }); v.label = "image"; await showView(v); }
  } finally { S.keepTarget = false; }
  showHead(s.layer ?? 0, s.head ?? "0");
  if (s.method && S.methods[s.method] && s.overlay === "method") selectMethod(s.method);
  if (s.query_token !== null && s.query_token !== undefined) await loadToken(s.query_token);
  if (s.faithfulness_method) $("faith-method").value = s.faithfulness_method;
}

function syncOutputs() {
  $("residual-value").textContent = $("residual").value;
  $("discard-value").textContent = $("discard").value;
}

// ------------------------------------------------------------------------------- wiring
async function start() {
  if (!TOKEN) { status("open the address `vitkit explore` printed (it ends with ?token=...)", true); return; }
  S.model = await api("/api/model");
  const m = S.model;
  $("model-name").textContent = `${m.name}: ${m.depth} layers x ${m.heads} heads, ${m.grid[0]}x${m.grid[1]} patches of ${m.patch_size} px, input ${m.input[0]}x${m.input[1]}, readout ${m.pool}`;
  for (let l = 0; l < m.depth; l++) $("layer").add(new Option(`${l}`, String(l)));
  for (let h = 0; h < m.heads; h++) $("head").add(new Option(`${h}`, String(h)));
  for (const f of m.fusions) $("head").add(new Option(`${f} of heads`, f));
  m.prefix_tokens.forEach((n, i) => $("query").add(new Option(n, String(i))));
  for (let t = 0; t < m.grid[0] * m.grid[1]; t++) {
    $("query").add(new Option(`patch ${t} (row ${Math.floor(t / m.grid[1])}, col ${t % m.grid[1]})`, String(m.prefix_tokens.length + t)));
  }
  m.classes.forEach((n, i) => $("target").add(new Option(`${i}: ${n}`, String(i))));
  let group = null, optgroup = null;
  for (const s of m.samples) {
    if (s.group !== group) { group = s.group; optgroup = document.createElement("optgroup"); optgroup.label = group; $("samples").appendChild(optgroup); }
    optgroup.appendChild(new Option(s.label, String(s.id)));
  }
  fitCanvas($("main"), 448);
  for (const id of ["token-row", "token-rollout"]) fitCanvas($(id), 224);
  buildMethods();

  if (!m.has_classifier) {
    for (const id of ["target", "faith-run", "causal-run"]) $(id).disabled = true;
    $("faith-text").textContent = $("lens-text").textContent = "not available: the checkpoint has no classifier head";
  }
  $("file").addEventListener("change", (e) => e.target.files[0] && quietly(upload(e.target.files[0])));
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault(); drop.classList.remove("over");
    if (e.dataTransfer.files[0]) quietly(upload(e.dataTransfer.files[0]));
  });
  $("samples").addEventListener("change", (e) => quietly(pickSample(e.target.value)));
  $("main").addEventListener("click", (e) => S.view && quietly(loadToken(patchAt(e))));
  $("query").addEventListener("change", (e) => S.view && quietly(loadToken(Number(e.target.value))));
  $("layer").addEventListener("change", (e) => showHead(Number(e.target.value), S.head));
  $("head").addEventListener("change", async (e) => {
    const h = e.target.value;
    if (S.view && ["mean", "max", "min"].includes(h) && (!S.fused || S.fused.name !== h)) {
      $("fusion-column").value = h; await loadFused(h); drawMosaic();
    }
    showHead(S.layer, h);
  });
  $("fusion-column").addEventListener("change", async (e) => {
    if (!S.view) return;
    if (e.target.value) await loadFused(e.target.value); else S.fused = null;
    drawMosaic(); showHead(S.layer, S.fused || !["mean", "max", "min"].includes(S.head) ? S.head : "0");
  });
  for (const id of ["show-grid", "show-box", "opacity"]) $(id).addEventListener("input", drawMain);
  for (const id of ["residual", "discard"]) $(id).addEventListener("input", syncOutputs);
  for (const id of ["residual", "discard", "fusion", "target"]) $(id).addEventListener("change", () => quietly(loadMethods()));
  $("faith-run").addEventListener("click", () => quietly(runFaithfulness()));
  $("causal-run").addEventListener("click", async () => {
    $("causal-run").disabled = true;  // one at a time: each is many forwards of the model
    try { await quietly(runCausal()); } finally { $("causal-run").disabled = !m.has_classifier; }
  });
  $("export-png").addEventListener("click", () => {
    const c = $("main"), out = document.createElement("canvas");
    out.width = c.width; out.height = c.height + 24;
    const ctx = out.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, out.width, out.height);
    ctx.drawImage(c, 0, 0);
    ctx.fillStyle = "#000"; ctx.font = "13px sans-serif";
    ctx.fillText($("overlay-title").textContent, 4, c.height + 16);
    out.toBlob((b) => download(b, "vitkit-explore.png"));
  });
  $("export-npz").addEventListener("click", async () => {
    if (!S.view) return;
    const r = await api("/api/export.npz", Object.assign({ image: S.view.image, method: S.selectedMethod || m.applicable[0] }, methodParams()), { raw: true });
    download(await r.blob(), `vitkit-explore-${S.view.image.slice(0, 8)}.npz`);
  });
  $("export-json").addEventListener("click", () =>
    download(new Blob([JSON.stringify(settings(), null, 2)], { type: "application/json" }), "vitkit-explore.json"));
  $("import-json").addEventListener("change", async (e) => {
    const f = e.target.files[0];
    if (!f) return;
    try { await applySettings(JSON.parse(await f.text())); } catch (err) { status(`cannot apply these settings: ${err.message}`, true); }
  });
  status("ready: pick a sample or drop an image");
  document.body.dataset.ready = "1";
}

window.addEventListener("DOMContentLoaded", () => start().catch((e) => status(e.message, true)));
