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

function range(data) {  // the smallest and largest value of an array
  let lo = Infinity, hi = -Infinity;
  for (const v of data) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return { lo, hi };
}

function fmt(v) {  // a value for a scale: 3 significant digits
  return Math.abs(v) >= 1000 || (Math.abs(v) < 0.001 && v !== 0) ? v.toExponential(2) : Number(v.toPrecision(3)).toString();
}

function mapCanvas(map, alpha, scale) {  // {data, h, w} -> a w x h canvas; scale {lo, hi} or the map's own
  const { lo, hi } = scale || range(map.data);
  const span = hi - lo;
  const c = document.createElement("canvas");
  c.width = map.w; c.height = map.h;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(map.w, map.h);
  map.data.forEach((v, i) => {  // a constant map has no colour to show: left transparent
    const [r, g, b] = colour(span > 0 ? (v - lo) / span : 0);
    img.data.set([r, g, b, span > 0 ? Math.round(alpha * 255) : 0], 4 * i);
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
    ctx.drawImage(mapCanvas(map, opts.alpha ?? Number($("opacity").value), opts.scale), 0, 0, canvas.width, canvas.height);
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
function sharedScale() {  // one scale over every head of every layer (and the fused column)
  if ($("scale").value !== "shared" || !S.heads) return null;
  if (!S.headRange) S.headRange = range(S.heads.data);
  const r = S.headRange, f = S.fused ? range(S.fused.data) : r;
  return { lo: Math.min(r.lo, f.lo), hi: Math.max(r.hi, f.hi) };
}

function headScale() { return sharedScale(); }  // null: each map its own min-max

function drawBar(canvas) {  // the colour map from dark (left) to bright (right)
  const ctx = canvas.getContext("2d");
  for (let x = 0; x < canvas.width; x++) {
    const [r, g, b] = colour(x / (canvas.width - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`; ctx.fillRect(x, 0, 1, canvas.height);
  }
}

function showScale(map, scale, what) {  // the main figure's colour bar: real values
  const bar = $("main-scale");
  if (!map) { bar.hidden = true; return; }
  bar.hidden = false;
  const { lo, hi } = scale || range(map.data), own = range(map.data);
  $("main-lo").textContent = fmt(lo); $("main-hi").textContent = fmt(hi);
  bar.dataset.lo = String(lo); bar.dataset.hi = String(hi);
  const constant = own.hi === own.lo;
  $("main-note").textContent = !constant ? `${what}; this map: ${fmt(own.lo)} to ${fmt(own.hi)}`
    : scale ? `${what}; this map is ${fmt(own.lo)} on every patch (uniform), drawn at that value`
      : `constant map: ${fmt(own.lo)} on every patch; it ranks no patch above another and explains nothing here`;
  bar.classList.toggle("constant", constant);
}

function drawMain() {
  const patch = S.query !== null && S.query >= S.model.prefix_tokens.length ? S.query - S.model.prefix_tokens.length : null;
  const map = S.overlay ? S.overlay.map : null;
  const scale = S.overlay && S.overlay.kind === "head" ? headScale() : null;
  drawFigure($("main"), map, { grid: $("show-grid").checked, box: $("show-box").checked, patch, scale });
  showScale(map, scale, scale ? "colour: one scale over every layer and head" : "colour: this map's own minimum to maximum");
  $("overlay-title").textContent = S.overlay ? S.overlay.title : (S.view ? S.view.label : "no image yet");
  if ($("compare-kind").value) quietly(updateCompare());
}

// ------------------------------------------------------------------------------ compare
// B: another image (a sample), another class (the method's map for it), or the second
// checkpoint (the same image through --compare-checkpoint, asked with model=b). Both sides
// are drawn on one colour scale, so equal values look equal.
const CMP = { key: null, view: null, picture: null };

async function compareView(kind) {  // B's analysed image: {image, heads, picture, label}
  const key = kind === "image" ? `image:${$("compare-sample").value}` : kind === "model" ? `model:${S.view.image}` : `same:${S.view.image}`;
  if (CMP.key === key) return CMP.view;
  let v;
  if (kind === "image") {
    if ($("compare-sample").value === "") return null;
    v = await api("/api/sample", { id: $("compare-sample").value }, { method: "POST" });
  } else if (kind === "model") {
    const png = await new Promise((r) => PICTURE.toBlob(r, "image/png"));  // the picture the model saw
    v = await api("/api/image", { model: "b" }, { method: "POST", body: png, headers: { "Content-Type": "application/octet-stream" } });
    v.label = `${S.model.compare}`;
  } else {
    v = S.view;
  }
  CMP.key = key; CMP.view = Object.assign({}, v, { headsArr: decode(v.heads) });
  CMP.picture = pictureCanvas(v.picture);
  return CMP.view;
}

async function updateCompare() {
  const kind = $("compare-kind").value;
  for (const id of ["compare-a", "compare-b"]) { const c = $(id); c.getContext("2d").clearRect(0, 0, c.width, c.height); }
  $("compare-a-caption").textContent = $("compare-b-caption").textContent = $("compare-note").textContent = "";
  if (!kind || !S.view || !S.overlay) return;
  if (kind === "class" && S.overlay.kind !== "method") { $("compare-note").textContent = "pick a method's map: the attention of a head does not depend on the class"; return; }
  const v = await compareView(kind);
  if (!v) { $("compare-note").textContent = "pick the image to compare with"; return; }
  const [gh, gw] = S.model.grid;
  let mapB, what;
  if (S.overlay.kind === "head" && !["mean", "max", "min"].includes(String(S.head))) {
    const H = S.model.heads;
    mapB = slice2d(v.headsArr, (S.layer * H + Number(S.head)) * gh * gw, gh, gw);
    what = `layer ${S.layer}, head ${S.head}`;
  } else {
    const method = S.overlay.kind === "method" ? S.selectedMethod : "cls";
    const params = Object.assign({}, methodParams(), { image: v.image, method });
    if (kind === "model") params.model = "b";
    if (kind === "class") params.target = $("compare-class").value;
    const r = await api("/api/method", params);
    mapB = { data: decode(r.map).data, h: gh, w: gw };
    what = r.target === null ? method : `${method} for ${className(r.target)}`;
  }
  const a = range(S.overlay.map.data), b = range(mapB.data);
  const scale = { lo: Math.min(a.lo, b.lo), hi: Math.max(a.hi, b.hi) };
  drawFigure($("compare-a"), S.overlay.map, { box: false, scale });
  const saved = PICTURE;
  PICTURE = CMP.picture;  // draw B over its own picture
  try { drawFigure($("compare-b"), mapB, { box: false, scale }); } finally { PICTURE = saved; }
  const side = { image: `image: ${v.label || v.image}`, class: `class: ${$("compare-class").selectedOptions[0].textContent}`, model: `checkpoint: ${S.model.compare}` }[kind];
  $("compare-a-caption").textContent = `${S.overlay.title} (this map ${fmt(a.lo)} to ${fmt(a.hi)})`;
  $("compare-b-caption").textContent = `${side}, ${what} (this map ${fmt(b.lo)} to ${fmt(b.hi)})`;
  $("compare-note").textContent = `one colour scale for both: ${fmt(scale.lo)} (dark) to ${fmt(scale.hi)} (bright)`;
  $("compare-panel").dataset.drawn = String(Date.now());
}

function className(i) {  // "class 7" for a model without names, never "class class 7"
  const name = S.model.classes[i];
  return /^class /.test(name) ? name : `class ${name}`;
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
  const shared = headScale();
  $("mosaic-caption").textContent = shared
    ? `colour: one scale for every cell, ${fmt(shared.lo)} (dark) to ${fmt(shared.hi)} (bright): a uniform head looks uniform (every patch ${fmt(1 / (S.model.grid[0] * S.model.grid[1]))} when nothing goes to the prefix tokens)`
    : "colour: each cell its own minimum (dark) to maximum (bright); choose a shared scale to compare heads";
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
      drawFigure(c, headMap(l, h), { alpha: 0.75, scale: headScale() });
      c.addEventListener("click", () => showHead(l, h));
      box.appendChild(c);
    }
  }
}

// ----------------------------------------------------------------------------- images
async function showView(v) {
  S.view = v; S.query = null; S.methods = {}; S.selectedMethod = null; S.stats = null; S.causal = null;
  if (CMP.key && !CMP.key.startsWith("image:")) CMP.key = null;  // the same image, or B of it: again
  if (!S.keepTarget) $("target").value = "";  // a new image: explain its own prediction
  PICTURE = pictureCanvas(v.picture);
  S.heads = decode(v.heads); S.fused = null; S.headRange = null;
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
  $("faith-text").textContent = ""; $("lens-text").textContent = "";
  for (const id of ["importance-table", "exact-table"]) $(id).innerHTML = "";
  $("exact-text").textContent = "";
  $("causal-exact").disabled = true;
  status("");
  delete document.body.dataset.view;
  const image = v.image;
  // what needs only the stored attention maps first, the per-head numbers, then the gradients
  await loadMethods(attentionOnly());
  await loadStats();
  await quietly(loadFeatures());  // a failure is said in the status line; the rest goes on
  if (S.view && S.view.image === image) document.body.dataset.view = "attention";
  await loadMethods(withGradients());
  if (S.view && S.view.image === image) document.body.dataset.view = "full";
}

// Another image is coming: the old one's jobs would keep the model (and its analysis) busy.
// Asked before the new image is sent; each job stops at its next step.
async function leaving() {
  await Promise.all(Object.keys(JOBS).map((panel) => cancelJob(panel, true).catch(() => {})));
}

async function upload(file) {
  await leaving();
  status(`reading ${file.name} ...`);
  S.sampleId = null;
  $("samples").value = "";  // the list no longer names what is shown
  const v = await api("/api/image", {}, { method: "POST", body: file, headers: { "Content-Type": "application/octet-stream" } });
  v.label = file.name;
  await showView(v);
}

async function pickSample(id) {
  if (id === "") return;
  await leaving();
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
  S.overlay = { kind: "method", map: m.map, title: m.target === null ? name : `${name} for ${className(m.target)}` };
  $("faith-method").value = name;
  drawMain();
}

// the methods that read only the stored attention maps, and those that run the model
const attentionOnly = () => S.model.applicable.filter((n) => !S.model.method_info[n].gradients);
const withGradients = () => S.model.applicable.filter((n) => S.model.method_info[n].gradients);
const using = (option) => S.model.applicable.filter((n) => S.model.method_info[n].options.includes(option));

function showMethod(name, r) {  // one method's answer, drawn in its figure
  const [gh, gw] = S.model.grid;
  S.methods[name] = { map: { data: decode(r.map).data, h: gh, w: gw }, target: r.target, constant: r.constant };
  const fig = $(`method-${name}`);
  drawFigure(fig.querySelector("canvas"), S.methods[name].map, { box: true });
  const what = r.target === null ? "" : ` (${className(r.target)})`;
  const scale = r.constant ? ` Constant map (${fmt(r.lo)} everywhere): nothing to show, no faithfulness score.` : ` Colour: ${fmt(r.lo)} (dark) to ${fmt(r.hi)} (bright).`;
  // a relevance method's budget, as the server computed it: where the explained logit goes
  const budget = r.budget ? ` Relevance budget (shares of the logit): ${r.budget.map(([label, , share]) => `${label} ${(100 * share).toFixed(1)}%`).join(", ")}.` : "";
  fig.querySelector("figcaption").textContent = `${name}${what}: ${S.model.methods[name]}.${scale}${budget}`;
  fig.classList.toggle("constant", r.constant);
  if (S.selectedMethod === name) selectMethod(name);
}

// The attention-only maps are asked directly (they read the stored maps: milliseconds); the
// gradient methods run as one job, each map drawn as it arrives, with progress and cancel; a
// newer job (another class, another image) supersedes it.
async function loadMethods(names) {
  if (!S.view) return;
  const image = S.view.image;
  const list = names || S.model.applicable;
  for (const name of list.filter((n) => !S.model.method_info[n].gradients)) {
    const r = await api("/api/method", Object.assign({ image, method: name }, methodParams()));
    if (!S.view || S.view.image !== image) return;  // another image came meanwhile
    showMethod(name, r);
  }
  const slow = list.filter((n) => S.model.method_info[n].gradients);
  if (!slow.length) return;
  const drawn = new Set();
  const draw = (answers) => {
    if (!S.view || S.view.image !== image) return;
    for (const [name, r] of Object.entries(answers)) if (!drawn.has(name)) { drawn.add(name); showMethod(name, r); }
  };
  const all = await runJob("methods", Object.assign({ image, methods: slow.join(",") }, methodParams()), "methods", draw);
  if (all) draw(all);
}

// ------------------------------------------------------------------------ faithfulness
// panels: [{title, xlabel, ylabel, xticks: [[value 0..1, label]], series: [{name, ys, xs, colour}]}];
// y from 0 to 1 with ticks every 0.25, the legend under the axes (never on the curves)
function plotCurves(canvas, panels) {
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const pw = canvas.width / panels.length, legend = 15 * Math.max(...panels.map((p) => p.series.length));
  const ticks = (n) => [...Array(n + 1).keys()].map((i) => [i / n, String(i / n)]);
  panels.forEach((panel, k) => {
    const x0 = k * pw + 42, y0 = 20, w = pw - 56, h = canvas.height - 58 - legend;
    ctx.fillStyle = "#222"; ctx.font = "12px sans-serif"; ctx.textAlign = "left";
    ctx.fillText(panel.title, x0 - 30, 13);
    ctx.font = "10px sans-serif";
    ctx.strokeStyle = "#e3e3e3"; ctx.lineWidth = 1;
    for (const [v, label] of ticks(4)) {  // y ticks and grid lines
      const py = y0 + h * (1 - v);
      ctx.beginPath(); ctx.moveTo(x0, py); ctx.lineTo(x0 + w, py); ctx.stroke();
      ctx.textAlign = "right"; ctx.fillText(label, x0 - 4, py + 3);
    }
    for (const [v, label] of panel.xticks || ticks(4)) {  // x ticks
      const px = x0 + w * v;
      ctx.beginPath(); ctx.moveTo(px, y0 + h); ctx.lineTo(px, y0 + h + 4); ctx.strokeStyle = "#999"; ctx.stroke();
      ctx.textAlign = "center"; ctx.fillText(label, px, y0 + h + 14);
    }
    ctx.strokeStyle = "#999"; ctx.strokeRect(x0, y0, w, h);
    ctx.textAlign = "center"; ctx.fillText(panel.xlabel || "", x0 + w / 2, y0 + h + 27);
    ctx.save(); ctx.translate(x0 - 32, y0 + h / 2); ctx.rotate(-Math.PI / 2);
    ctx.fillText(panel.ylabel || "p(class)", 0, 0); ctx.restore();
    panel.series.forEach((s, j) => {
      ctx.strokeStyle = s.colour; ctx.lineWidth = 2; ctx.beginPath();
      s.ys.forEach((y, i) => {
        const px = x0 + w * (s.xs ? s.xs[i] : i / (s.ys.length - 1)), py = y0 + h * (1 - y);
        if (i === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
      });
      ctx.stroke();
      const ly = y0 + h + 40 + 15 * j;  // the legend, below the axes
      ctx.fillStyle = s.colour; ctx.fillRect(x0, ly - 5, 14, 3);
      ctx.fillStyle = "#222"; ctx.textAlign = "left"; ctx.font = "11px sans-serif";
      ctx.fillText(s.name, x0 + 18, ly);
      ctx.font = "10px sans-serif";
    });
  });
  ctx.textAlign = "left";
}

// --------------------------------------------------------------------------- slow jobs
// A slow answer runs on the server as a job: started, polled for its progress (a bar, the
// time left and a cancel button under the panel), superseded by a newer one for the panel.
const JOBS = {};  // panel -> the job id running for it
const QUIET = new Set();  // jobs cancelled because their image was replaced: no message
async function runJob(kind, params, panel, onPartial) {
  const box = $(`${panel}-job`), bar = box.querySelector("progress"), text = box.querySelector(".eta");
  let job = await api("/api/job", Object.assign({ kind }, params), { method: "POST" });
  JOBS[panel] = job.id;
  box.hidden = false; box.dataset.state = job.state;
  try {
    while (job.state === "queued" || job.state === "running") {
      bar.value = job.fraction;
      text.textContent = job.state === "queued" ? "waiting for the model ..."
        : `${Math.round(100 * job.fraction)}%` + (job.eta_s !== null ? `, about ${Math.ceil(job.eta_s)} s left` : "");
      await new Promise((r) => setTimeout(r, 150));
      if (JOBS[panel] !== job.id) return null;  // superseded: a newer job fills the panel
      job = await api("/api/job", { id: job.id });
      if (job.partial && onPartial) onPartial(job.partial);  // drawn as it comes
    }
  } finally {
    if (JOBS[panel] === job.id) { box.hidden = true; box.dataset.state = job.state; delete JOBS[panel]; }
  }
  if (job.state === "cancelled") { if (!QUIET.has(job.id)) status(`${panel}: cancelled`); return null; }
  if (job.state === "error") { status(job.error, true); throw new Error(job.error); }
  return job.result;
}

async function cancelJob(panel, quiet) {
  const id = JOBS[panel];
  if (quiet && id) QUIET.add(id);
  if (id) await api("/api/job/cancel", { id }, { method: "POST" });
}

async function runFaithfulness() {
  if (!S.view) return;
  const method = $("faith-method").value;
  if (S.methods[method] && S.methods[method].constant) {
    $("faith-text").textContent = `the ${method} map is constant: it ranks no patch above another, so it gets no faithfulness score; pick another class or method`;
    return;
  }
  const draw = (r) => {
    const series = (key) => [
      { name: `${method} (AUC ${r[key + "_auc"][0].toFixed(3)})`, ys: r[key][0], xs: r.fractions, colour: "#d50000" },
      { name: `random (AUC ${r[key + "_auc"][1].toFixed(3)})`, ys: r[key][1], xs: r.fractions, colour: "#757575" },
    ];
    plotCurves($("faith-plot"), [
      { title: "deletion (lower is better)", series: series("deletion"), xlabel: "fraction of patches removed", ylabel: "p(class)" },
      { title: "insertion (higher is better)", series: series("insertion"), xlabel: "fraction of patches revealed", ylabel: "p(class)" },
    ]);
  };
  const first = (r) => {  // the curves, while the random maps and the checks still run
    draw(r);
    $("faith-text").textContent = `${method}, ${className(r.target)}: deletion AUC ${r.deletion_auc[0].toFixed(3)} (one random map ${r.deletion_auc[1].toFixed(3)}), insertion AUC ${r.insertion_auc[0].toFixed(3)} (baseline: ${r.baseline}). The comparison with 20 random maps and the sanity checks are still running ...`;
  };
  const r = await runJob("faithfulness", Object.assign({ image: S.view.image }, methodParams(), { method }), "faith", first);
  if (!r) return;
  draw(r);
  const beaten = Math.round(r.percentile * r.random_maps);
  const rand = r.randomisation, cls = r.class_sensitivity;
  $("faith-text").textContent = `${method}, ${className(r.target)}: deletion AUC ${r.deletion_auc[0].toFixed(3)} (one random map ${r.deletion_auc[1].toFixed(3)}), insertion AUC ${r.insertion_auc[0].toFixed(3)} (baseline: ${r.baseline}). ` +
    `Beats ${beaten} of ${r.random_maps} random maps on deletion (p ${r.p_value.toFixed(2)}). ` +
    `Model randomisation: ${rand.passes ? "passes" : "fails"} (rank correlation ${rand.correlation.toFixed(2)} once every block is re-initialised). ` +
    `Class sensitivity: ${cls.passes ? "passes" : "fails"} (correlation ${cls.correlation.toFixed(2)} with the least likely class's map). ` +
    r.verdict.text;
}

// ------------------------------------------------------------------------ heat tables
// scale: {lo, hi, mark, markLabel} (the table's own min-max when absent); a legend under it
function heatTable(el, arr, fmt, onClick, scale) {
  const [L, H] = arr.shape;
  const { lo, hi } = scale || range(arr.data);
  const table = document.createElement("table");
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  for (let h = 0; h < H; h++) { const th = document.createElement("th"); th.textContent = `h${h}`; head.appendChild(th); }
  for (let l = 0; l < L; l++) {
    const tr = table.insertRow();
    const th = document.createElement("th"); th.textContent = `L${l}`; tr.appendChild(th);
    for (let h = 0; h < H; h++) {
      const v = arr.data[l * H + h], td = tr.insertCell();
      const t = hi > lo ? (v - lo) / (hi - lo) : 0;
      const [r, g, b] = colour(t);
      td.style.background = `rgb(${r},${g},${b})`;
      td.style.color = t > 0.6 ? "#000" : "#fff";
      td.textContent = fmt(v);
      td.title = `layer ${l}, head ${h}: ${fmt(v)}`;
      td.dataset.layer = String(l); td.dataset.head = String(h);
      td.addEventListener("click", () => onClick(l, h));
    }
  }
  el.innerHTML = ""; el.appendChild(table);
  const legend = document.createElement("div");
  legend.className = "legend";
  const bar = document.createElement("canvas");
  bar.width = 160; bar.height = 10;
  drawBar(bar);
  if (scale && scale.mark !== undefined && hi > lo) {  // e.g. the value uniform attention gives
    const x = Math.round(159 * Math.min(Math.max((scale.mark - lo) / (hi - lo), 0), 1));
    const ctx = bar.getContext("2d");
    ctx.fillStyle = "#00e5ff"; ctx.fillRect(Math.max(0, x - 1), 0, 3, 10);
  }
  const left = document.createElement("span"), right = document.createElement("span");
  left.textContent = fmt(lo); right.textContent = fmt(hi);
  legend.append(left, bar, right);
  if (scale && scale.markLabel) {
    const mark = document.createElement("span");
    mark.className = "mark"; mark.textContent = scale.markLabel;
    legend.appendChild(mark);
  }
  legend.dataset.lo = String(lo); legend.dataset.hi = String(hi);
  el.appendChild(legend);
}

async function loadStats() {
  const r = await api("/api/stats", { image: S.view.image });
  S.stats = r;
  heatTable($("entropy-table"), decode(r.entropy), (v) => v.toFixed(2), showHead,
    { lo: 0, hi: r.max_entropy, mark: r.max_entropy, markLabel: `bright = uniform rows (${r.max_entropy.toFixed(2)} nats)` });
  const distance = decode(r.distance);
  heatTable($("distance-table"), distance, (v) => v.toFixed(1), showHead,
    { lo: 0, hi: Math.max(range(distance.data).hi, r.uniform_distance), mark: r.uniform_distance, markLabel: `cyan tick = uniform attention (${r.uniform_distance.toFixed(1)} px)` });
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
function importanceScale(arr) {  // symmetric around 0: the colour of "no effect" is fixed
  const { lo, hi } = range(arr.data), m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
  return { lo: -m, hi: m, mark: 0, markLabel: "cyan tick = no effect (0)" };
}

async function runCausal() {  // the logit lens and the linear estimate: one forward, one backward
  if (!S.view) return;
  const r = await runJob("causal", { image: S.view.image, target: $("target").value, measure: $("measure").value }, "causal");
  if (!r) return;
  S.causal = r;
  const name = className(r.target), L = r.lens_prob.length;
  const every = Math.max(1, Math.ceil(L / 12));
  const xticks = [...Array(L).keys()].filter((l) => l % every === 0 || l === L - 1).map((l) => [L > 1 ? l / (L - 1) : 0, String(l)]);
  plotCurves($("lens-plot"), [{ title: `p(${name}) read out after each layer`, xlabel: "layer", ylabel: "probability", xticks,
    series: [{ name: "logit lens", ys: r.lens_prob, colour: "#2962ff" }] }]);
  const formed = r.lens_top.findIndex((c, i) => r.lens_top.slice(i).every((d) => d === r.target));
  $("lens-text").textContent = `Top class after each layer: ${r.lens_top_names.join(", ")}. ` +
    (formed >= 0 ? `${name} is the top class from layer ${formed} on.` : `${name} never becomes the top class.`);
  const estimate = decode(r.importance);
  heatTable($("importance-table"), estimate, (v) => v.toFixed(2), showHead, importanceScale(estimate));
  $("importance-caption").textContent = `head importance for ${name}, linear estimate (attribution patching: the gradient times each head's output, one forward and one backward): the ${r.measure} lost if the head were zeroed. Click a cell for its map; "exact" ablates each head.`;
  $("causal-exact").disabled = false;
  $("exact-table").innerHTML = ""; $("exact-text").textContent = "";
}

async function runExact() {  // the exact ablation as a job: one forward per layer
  if (!S.view || !S.causal) return;
  const r = await runJob("importance", { image: S.view.image, target: S.causal.target, measure: S.causal.measure }, "causal");
  if (!r) return;
  const exact = decode(r.importance);
  heatTable($("exact-table"), exact, (v) => v.toFixed(2), showHead, importanceScale(exact));
  $("exact-text").textContent = `exact: each head zeroed in turn. Rank correlation with the linear estimate: ${r.correlation_with_estimate.toFixed(2)}.`;
}

// ---------------------------------------------------------------------- dense features
// The PCA picture of the patch tokens and one patch's cosine similarity with every patch, as the
// server computes them (vitkit.explain.dense); the high-norm artifact patches circled on both.
const F = { answer: null, rgb: null, similar: null, patch: null };

function rgbCanvas(rgb) {  // {data: (gh, gw, 3) in 0..1, shape} -> a gw x gh canvas
  const [gh, gw] = rgb.shape;
  const c = document.createElement("canvas");
  c.width = gw; c.height = gh;
  const ctx = c.getContext("2d"), img = ctx.createImageData(gw, gh);
  for (let i = 0; i < gh * gw; i++) {
    img.data.set([0, 1, 2].map((k) => Math.round(255 * rgb.data[3 * i + k])).concat([255]), 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  return c;
}

function markPatches(canvas, patches, colour, box) {  // circles (or a box) on [row, col] patches
  const ctx = canvas.getContext("2d"), [gh, gw] = S.model.grid;
  const sx = canvas.width / gw, sy = canvas.height / gh;
  ctx.strokeStyle = colour; ctx.lineWidth = 2;
  for (const [r, c] of patches) {
    ctx.beginPath();
    if (box) ctx.rect(c * sx, r * sy, sx, sy);
    else ctx.arc((c + 0.5) * sx, (r + 0.5) * sy, 0.5 * Math.min(sx, sy) + 1, 0, 2 * Math.PI);
    ctx.stroke();
  }
}

function drawFeatures() {
  const c = $("features-pca"), ctx = c.getContext("2d");
  ctx.clearRect(0, 0, c.width, c.height);
  if (!F.rgb) return;
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(rgbCanvas(F.rgb), 0, 0, c.width, c.height);
  markPatches(c, F.answer.artifacts, "#ff1744");
  if (F.patch) markPatches(c, [F.patch], "#00e5ff", true);
}

function clearFeatures(text) {
  F.answer = F.rgb = F.similar = F.patch = null;
  for (const id of ["features-pca", "features-similar"]) { const c = $(id); c.getContext("2d").clearRect(0, 0, c.width, c.height); }
  $("features-caption").textContent = text; $("similar-caption").textContent = "click a patch of the PCA picture";
  $("artifacts-note").textContent = ""; $("similar-scale").hidden = true;
  delete $("features-panel").dataset.similar;
}

async function loadFeatures() {
  if (!S.view) return;
  if (S.model.features) { clearFeatures(`not available: ${S.model.features}`); return; }
  clearFeatures("computing the PCA of the patch features ...");
  const image = S.view.image;
  const r = await api("/api/features", { image });
  if (!S.view || S.view.image !== image) return;  // another image came meanwhile
  F.answer = r; F.rgb = decode(r.rgb);
  drawFeatures();
  const fg = decode(r.foreground).data, share = fg.reduce((a, v) => a + v, 0) / fg.length;
  $("features-caption").textContent = `PCA of this image's patch tokens: the first component split at ${r.threshold} of its range (the sign that leaves the border background) keeps ${(100 * share).toFixed(0)}% of the patches as foreground; their first three components are red, green and blue (explained variance ${r.explained.map((v) => v.toFixed(3)).join(", ")}); background black.`;
  const names = r.artifacts.map(([row, col]) => `(row ${row}, column ${col})`);
  $("artifacts-note").textContent = names.length
    ? `High-norm artifact tokens (Darcet et al. 2023; last block, norm above median + 8 MAD), circled in red: ${names.join(", ")}.`
    : "No patch has an outlying norm in the last block (no high-norm artifact tokens to circle).";
  $("features-panel").dataset.drawn = image;
}

function patchOf(canvas, event) {  // [row, col] under a click on a canvas showing the grid
  const rect = canvas.getBoundingClientRect(), [gh, gw] = S.model.grid;
  return [Math.min(gh - 1, Math.floor((event.clientY - rect.top) / rect.height * gh)),
    Math.min(gw - 1, Math.floor((event.clientX - rect.left) / rect.width * gw))];
}

async function loadSimilar(row, col) {
  if (!S.view || !F.answer) return;
  const image = S.view.image, [gh, gw] = S.model.grid;
  const r = await api("/api/similar", { image, row, col });
  if (!S.view || S.view.image !== image) return;
  F.similar = { data: decode(r.map).data, h: gh, w: gw }; F.patch = [row, col];
  const c = $("features-similar");
  drawFigure(c, F.similar, { alpha: 0.8 });
  markPatches(c, F.answer.artifacts, "#ff1744");
  markPatches(c, [F.patch], "#00e5ff", true);
  drawFeatures();
  $("similar-scale").hidden = false;
  $("similar-lo").textContent = fmt(r.lo); $("similar-hi").textContent = fmt(r.hi);
  $("similar-caption").textContent = `patch (row ${row}, column ${col}), boxed: its cosine similarity with every patch, ${fmt(r.lo)} (dark) to ${fmt(r.hi)} (bright); the patch itself scores ${fmt(F.similar.data[row * gw + col])}`;
  $("features-panel").dataset.similar = `${row},${col}`;
}

// ------------------------------------------------------------------------------ export
function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// One self-contained HTML page with everything as shown: the model, the image and its class,
// the figure with its scale, the mosaic, the methods, the curves, the tables and the verdicts
// (pictures inlined as PNG data, tables copied with their colours; nothing fetched).
function reportHtml() {
  const img = (canvas, alt) => `<img alt="${escapeHtml(alt)}" src="${canvas.toDataURL("image/png")}">`;
  const text = (id) => escapeHtml($(id).textContent);
  const section = (title, body) => body ? `<section><h2>${escapeHtml(title)}</h2>${body}</section>` : "";
  const mosaic = [...document.querySelectorAll("#mosaic canvas")].map((c) => `<figure>${img(c, c.title)}<figcaption>${escapeHtml(c.title)}</figcaption></figure>`).join("");
  const methods = [...document.querySelectorAll("#methods figure:not(.unavailable)")].filter((f) => S.methods[f.id.slice(7)])
    .map((f) => `<figure>${img(f.querySelector("canvas"), f.id.slice(7))}<figcaption>${escapeHtml(f.querySelector("figcaption").textContent)}</figcaption></figure>`).join("");
  const table = (id, caption) => $(id).innerHTML ? `<figure>${$(id).querySelector("table").outerHTML}<figcaption>${text(caption)} (${escapeHtml($(id).querySelector(".legend") ? $(id).querySelector(".legend").textContent : "")})</figcaption></figure>` : "";
  const top = [...document.querySelectorAll("#top5 li")].map((li) => `<li>${escapeHtml(li.textContent)}</li>`).join("");
  const faith = $("faith-text").textContent ? img($("faith-plot"), "faithfulness curves") + `<p>${text("faith-text")}</p>` : "";
  const causal = S.causal ? `<figure>${img($("lens-plot"), "logit lens")}<figcaption>logit lens: the class's probability read out after each layer</figcaption></figure><p>${text("lens-text")}</p>` + table("importance-table", "importance-caption") + table("exact-table", "exact-text") : "";
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>vitkit explore report: ${escapeHtml(S.view.label || S.view.image)}</title>
<style>body{font:14px/1.4 system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}figure{display:inline-block;margin:.3em;vertical-align:top}figcaption{font-size:.85em;max-width:320px}#mosaic img{width:64px}table{border-collapse:collapse;font-size:.75em}td,th{padding:1px 3px;text-align:right}</style></head><body>
<h1>vitkit explore report</h1>
<p id="model">${text("model-name")}</p>
<p>Image: ${escapeHtml(S.view.label || S.view.image)} (id ${escapeHtml(S.view.image)}); class explained: ${escapeHtml($("target").value === "" ? "the prediction" : className(Number($("target").value)))}; made ${escapeHtml(new Date().toISOString())}.</p>
${section("Prediction", `<ol>${top}</ol>`)}
${section("The figure", `${img($("main"), "main figure")}<p>${text("overlay-title")}</p><p>${$("main-scale").hidden ? "" : `colour scale ${text("main-lo")} to ${text("main-hi")}: `}${text("main-note")}</p>`)}
${section("Layers x heads", `<p>${text("mosaic-caption")}</p><div id="mosaic">${mosaic}</div>`)}
${section("Methods", methods)}
${section("How far to trust the map", faith)}
${section("Per-head numbers", table("entropy-table", "entropy-caption") + table("distance-table", "distance-caption") + `<p>${text("outliers")}</p>`)}
${section("Causal", causal)}
${section("Dense features", F.rgb ? `${img($("features-pca"), "PCA of the patch features")}${F.similar ? img($("features-similar"), "patch similarity") : ""}<p>${text("features-caption")}</p><p>${F.similar ? text("similar-caption") : ""}</p><p>${text("artifacts-note")}</p>` : "")}
<h2>Settings</h2><pre>${escapeHtml(JSON.stringify(Object.assign(settings(), { picture: undefined }), null, 2))}</pre>
</body></html>`;
}

function settings() {
  return {
    vitkit_explore: 1, model: S.model.name, sample: S.sampleId, image: S.view ? S.view.image : null,
    layer: S.layer, head: S.head, fusion_column: $("fusion-column").value, query_token: S.query,
    overlay: S.overlay ? S.overlay.kind : null, method: S.selectedMethod, target: $("target").value,
    residual: Number($("residual").value), discard_ratio: Number($("discard").value), rollout_fusion: $("fusion").value,
    opacity: Number($("opacity").value), patch_grid: $("show-grid").checked, box: $("show-box").checked,
    faithfulness_method: $("faith-method").value, measure: $("measure").value,
    colour_scale: $("scale").value, similar_patch: F.patch,
    // an uploaded image travels with its settings (as the model sees it), so they work in
    // any later session; a sample is named by its number
    picture: S.sampleId === null && PICTURE ? PICTURE.toDataURL("image/png") : null,
  };
}

function checkSettings(s) {  // what a settings file may hold; a message for anything else
  const m = S.model, problems = [];
  const int = (v, lo, hi) => Number.isInteger(v) && v >= lo && v <= hi;
  if (typeof s !== "object" || s === null || s.vitkit_explore !== 1) return ["it is not a settings file of vitkit explore (no \"vitkit_explore\": 1)"];
  if (s.layer !== undefined && !int(s.layer, 0, m.depth - 1)) problems.push(`layer ${JSON.stringify(s.layer)} does not exist (0..${m.depth - 1})`);
  const heads = [...Array(m.heads).keys()].map(String).concat(m.fusions);
  if (s.head !== undefined && !heads.includes(String(s.head))) problems.push(`head ${JSON.stringify(s.head)} does not exist (0..${m.heads - 1}, or ${m.fusions.join(", ")})`);
  if (s.sample !== null && s.sample !== undefined && !int(s.sample, 0, m.samples.length - 1)) problems.push(`sample ${JSON.stringify(s.sample)} does not exist (0..${m.samples.length - 1})`);
  const tokens = m.prefix_tokens.length + m.grid[0] * m.grid[1];
  if (s.query_token !== null && s.query_token !== undefined && !int(s.query_token, 0, tokens - 1)) problems.push(`query token ${JSON.stringify(s.query_token)} does not exist (0..${tokens - 1})`);
  if (s.target && !int(Number(s.target), 0, m.classes.length - 1)) problems.push(`class ${JSON.stringify(s.target)} does not exist (0..${m.classes.length - 1})`);
  for (const [key, lo, hi] of [["residual", 0, 1], ["discard_ratio", 0, 0.95], ["opacity", 0, 1]]) {
    if (s[key] !== undefined && !(typeof s[key] === "number" && s[key] >= lo && s[key] <= hi)) problems.push(`${key} ${JSON.stringify(s[key])} is not a number in ${lo}..${hi}`);
  }
  for (const [key, allowed] of [["fusion_column", ["", "mean", "max", "min"]], ["rollout_fusion", ["mean", "max", "min"]], ["measure", ["logit", "prob"]], ["colour_scale", ["map", "shared"]]]) {
    if (s[key] !== undefined && s[key] !== null && !allowed.includes(s[key])) problems.push(`${key} ${JSON.stringify(s[key])} is not one of ${allowed.join(", ")}`);
  }
  if (s.similar_patch !== null && s.similar_patch !== undefined && !(Array.isArray(s.similar_patch) && s.similar_patch.length === 2 && int(s.similar_patch[0], 0, m.grid[0] - 1) && int(s.similar_patch[1], 0, m.grid[1] - 1))) problems.push(`similar patch ${JSON.stringify(s.similar_patch)} is not a [row, column] of the ${m.grid[0]}x${m.grid[1]} grid`);
  if (s.method && !m.applicable.includes(s.method)) problems.push(`method ${JSON.stringify(s.method)} does not apply to this model (${m.applicable.join(", ")})`);
  if (s.faithfulness_method && !m.applicable.includes(s.faithfulness_method)) problems.push(`faithfulness method ${JSON.stringify(s.faithfulness_method)} does not apply to this model`);
  return problems;
}

async function pictureBlob(dataUrl) {  // a settings file's picture -> PNG bytes
  if (typeof dataUrl !== "string" || !dataUrl.startsWith("data:image/png;base64,")) throw new Error("the settings' picture is not a PNG data URL");
  return new Blob([Uint8Array.from(atob(dataUrl.split(",", 2)[1]), (c) => c.charCodeAt(0))], { type: "image/png" });
}

async function applySettings(s) {
  const problems = checkSettings(s);
  if (problems.length) { status(`cannot apply these settings: ${problems.join("; ")}`, true); return; }
  $("scale").value = s.colour_scale || "map";
  $("fusion-column").value = s.fusion_column || ""; $("target").value = s.target || "";
  $("residual").value = s.residual ?? 0.5; $("discard").value = s.discard_ratio ?? 0;
  $("fusion").value = s.rollout_fusion || "mean"; $("opacity").value = s.opacity ?? 0.6;
  $("show-grid").checked = !!s.patch_grid; $("show-box").checked = s.box !== false;
  $("measure").value = s.measure || "logit";
  syncOutputs();
  S.keepTarget = true;
  try {
    if (s.sample !== null && s.sample !== undefined) await pickSample(String(s.sample));
    else if (s.picture) {  // the image itself: works in any session of this model
      const v = await api("/api/image", {}, { method: "POST", body: await pictureBlob(s.picture), headers: { "Content-Type": "application/octet-stream" } });
      v.label = "the settings' image"; S.sampleId = null; $("samples").value = ""; await showView(v);
    } else if (s.image) { const v = await api("/api/view", { image: s.image }); v.label = "image"; await showView(v); }
  } finally { S.keepTarget = false; }
  showHead(s.layer ?? 0, s.head ?? "0");
  if (s.method && S.methods[s.method] && s.overlay === "method") selectMethod(s.method);
  if (s.query_token !== null && s.query_token !== undefined) await loadToken(s.query_token);
  if (s.faithfulness_method) $("faith-method").value = s.faithfulness_method;
  if (s.similar_patch) await loadSimilar(...s.similar_patch);
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
  for (const list of ["samples", "compare-sample"]) {
    let group = null, optgroup = null;
    for (const s of m.samples) {
      if (s.group !== group) { group = s.group; optgroup = document.createElement("optgroup"); optgroup.label = group; $(list).appendChild(optgroup); }
      optgroup.appendChild(new Option(s.label, String(s.id)));
    }
  }
  m.classes.forEach((n, i) => $("compare-class").add(new Option(`${i}: ${n}`, String(i))));
  if (!m.compare) $("compare-kind").querySelector("option[value=model]").disabled = true;
  if (!m.has_classifier) $("compare-kind").querySelector("option[value=class]").disabled = true;
  for (const id of ["compare-a", "compare-b"]) fitCanvas($(id), 224);
  for (const id of ["compare-kind", "compare-sample", "compare-class"]) $(id).addEventListener("change", () => quietly(updateCompare()));
  fitCanvas($("main"), 448);
  drawBar($("main-bar"));
  for (const id of ["token-row", "token-rollout", "features-pca", "features-similar"]) fitCanvas($(id), 224);
  drawBar($("similar-bar"));
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
  for (const id of ["features-pca", "features-similar"]) {
    $(id).addEventListener("click", (e) => S.view && quietly(loadSimilar(...patchOf($(id), e))));
  }
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
  // each setting re-fetches only the maps that depend on it
  $("target").addEventListener("change", () => quietly(loadMethods(withGradients())));
  $("residual").addEventListener("change", () => quietly(loadMethods(using("residual"))));
  $("discard").addEventListener("change", () => quietly(loadMethods(using("discard_ratio"))));
  $("fusion").addEventListener("change", () => quietly(loadMethods(using("head_fusion"))));
  $("scale").addEventListener("change", () => { drawMosaic(); drawMain(); });
  $("faith-run").addEventListener("click", () => quietly(runFaithfulness()));
  $("causal-run").addEventListener("click", () => quietly(runCausal()));
  $("causal-exact").addEventListener("click", () => quietly(runExact()));
  $("faith-cancel").addEventListener("click", () => quietly(cancelJob("faith")));
  $("methods-cancel").addEventListener("click", () => quietly(cancelJob("methods")));
  $("causal-cancel").addEventListener("click", () => quietly(cancelJob("causal")));
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
  $("export-html").addEventListener("click", () => {
    if (!S.view) { status("pick a sample or drop an image first", true); return; }
    download(new Blob([reportHtml()], { type: "text/html" }), `vitkit-explore-${S.view.image.slice(0, 8)}.html`);
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
