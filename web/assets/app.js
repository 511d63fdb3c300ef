// meshscope dashboard: renders snapshots (docs/api.md) that arrive as server-sent events.
// No libraries; every chart is drawn on a canvas. Elements carry data-* attributes that
// tests read: the heatmap's data-version (the snapshot it shows) and data-cells (cells
// drawn), the timeline's data-spans, the pipeline's data-step, data-stages and data-blocks,
// the charts' data-points, the suggestions' data-id and data-state.
'use strict';

const $ = (id) => document.getElementById(id);

const view = {
  snap: null,     // the snapshot shown
  metric: 'bytes', // heatmap: bytes | seconds | busbw
  dim: 'all',     // heatmap: all | mesh dim index
  cells: null,    // heatmap values drawn, for the hover tip
  busy: false,    // a control request is in flight
  accepted: 0,    // the suggestion accepted from this page, until the job acts on it
};

// --- formatting ------------------------------------------------------------------------

function fmtBytes(b) {
  if (!Number.isFinite(b)) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let u = 0;
  while (Math.abs(b) >= 1024 && u < units.length - 1) { b /= 1024; u++; }
  return (u ? b.toFixed(b < 10 ? 2 : 1) : b.toFixed(0)) + ' ' + units[u];
}

function fmtSeconds(s) {
  if (!Number.isFinite(s)) return '-';
  const a = Math.abs(s);
  if (a >= 1) return s.toFixed(2) + ' s';
  if (a >= 1e-3) return (s * 1e3).toFixed(a >= 0.1 ? 0 : 1) + ' ms';
  if (a >= 1e-6) return (s * 1e6).toFixed(0) + ' \u00b5s';
  return a === 0 ? '0' : (s * 1e9).toFixed(0) + ' ns';
}

function fmtNum(x, digits) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '-';
  const a = Math.abs(x);
  if (a >= 1e9) return (x / 1e9).toFixed(2) + 'G';
  if (a >= 1e6) return (x / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (x / 1e3).toFixed(1) + 'k';
  return x.toFixed(digits === undefined ? 0 : digits);
}

function fmtGBs(x) { return Number.isFinite(x) ? x.toFixed(x >= 10 ? 1 : 2) + ' GB/s' : '-'; }

function fmtValue(metric, v) {
  if (metric === 'bytes') return fmtBytes(v);
  if (metric === 'seconds') return fmtSeconds(v);
  return fmtGBs(v);
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// --- colour scale ------------------------------------------------------------------------

// Dark blue through teal and green to yellow; perceived brightness rises monotonically.
const RAMP = [
  [0.0, [33, 37, 82]],
  [0.25, [41, 92, 150]],
  [0.5, [33, 150, 142]],
  [0.75, [131, 199, 84]],
  [1.0, [246, 228, 70]],
];

function ramp(t) {
  t = Math.max(0, Math.min(1, Number.isFinite(t) ? t : 0));
  for (let i = 1; i < RAMP.length; i++) {
    if (t <= RAMP[i][0]) {
      const [t0, c0] = RAMP[i - 1];
      const [t1, c1] = RAMP[i];
      const f = (t - t0) / (t1 - t0);
      const c = c0.map((v, k) => Math.round(v + f * (c1[k] - v)));
      return `rgb(${c[0]},${c[1]},${c[2]})`;
    }
  }
  return 'rgb(246,228,70)';
}

// --- heatmap -----------------------------------------------------------------------------

function heatmapSource(a) {
  if (view.dim === 'all') return a.heatmap;
  return a.dims[Number(view.dim)] || a.heatmap;
}

function heatmapValues(h, n) {
  const out = new Float64Array(n * n);
  for (let i = 0; i < n * n; i++) {
    const b = h.bytes[i] || 0;
    const s = h.seconds[i] || 0;
    if (view.metric === 'bytes') out[i] = b;
    else if (view.metric === 'seconds') out[i] = s;
    else out[i] = s > 0 ? b / s / 1e9 : 0;
  }
  return out;
}

function syncDimOptions(a) {
  const sel = $('hm-dim');
  const want = ['all'].concat(a.dims.map((d, i) => String(i)));
  const have = Array.from(sel.options).map((o) => o.value);
  if (want.join(',') === have.join(',')) return;
  const keep = sel.value;
  sel.textContent = '';
  want.forEach((v) => {
    const o = document.createElement('option');
    o.value = v;
    o.textContent = v === 'all' ? 'all' : `${a.dims[Number(v)].name} (mesh dim ${v})`;
    sel.appendChild(o);
  });
  sel.value = want.includes(keep) ? keep : 'all';
  view.dim = sel.value;
}

function drawHeatmap() {
  const snap = view.snap;
  const cv = $('heatmap');
  const ctx = cv.getContext('2d');
  const W = cv.width;
  const H = cv.height;
  ctx.fillStyle = cssVar('--card') || '#fff';
  ctx.fillRect(0, 0, W, H);
  const a = snap && snap.analysis;
  const n = a ? a.nranks : 0;
  if (!n) {
    ctx.fillStyle = cssVar('--muted');
    ctx.font = '13px system-ui, sans-serif';
    ctx.fillText('no communication recorded yet', 20, 30);
    cv.dataset.cells = '0';
    cv.dataset.version = String(snap ? snap.version : 0);
    view.cells = null;
    drawLegend(0);
    return;
  }
  syncDimOptions(a);
  const vals = heatmapValues(heatmapSource(a), n);
  let max = 0;
  for (const v of vals) if (v > max) max = v;
  const pad = n <= 32 ? 28 : 6;
  const size = Math.min(W, H) - pad - 4;
  const cell = size / n;
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < n; j++) {
      ctx.fillStyle = ramp(max > 0 ? vals[i * n + j] / max : 0);
      ctx.fillRect(pad + j * cell, pad + i * cell, Math.ceil(cell), Math.ceil(cell));
    }
  }
  if (n <= 32) {
    ctx.fillStyle = cssVar('--muted');
    ctx.font = '11px system-ui, sans-serif';
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    for (let i = 0; i < n; i++) {
      ctx.fillText(String(i), pad + (i + 0.5) * cell, pad / 2);
      ctx.fillText(String(i), pad / 2, pad + (i + 0.5) * cell);
    }
  }
  view.cells = { vals, n, pad, cell };
  cv.dataset.cells = String(n * n);
  cv.dataset.version = String(snap.version);
  drawLegend(max);
  $('hm-window').textContent =
    a.step_hi >= 0 ? `steps ${a.step_lo}\u2013${a.step_hi}` : '';
}

function drawLegend(max) {
  const cv = $('heatmap-legend');
  const ctx = cv.getContext('2d');
  ctx.clearRect(0, 0, cv.width, cv.height);
  const x0 = 10;
  const w = cv.width - 20;
  for (let x = 0; x < w; x++) {
    ctx.fillStyle = ramp(x / (w - 1));
    ctx.fillRect(x0 + x, 4, 1, 14);
  }
  ctx.fillStyle = cssVar('--muted');
  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'top';
  ctx.textAlign = 'left';
  ctx.fillText(fmtValue(view.metric, 0), x0, 24);
  ctx.textAlign = 'right';
  ctx.fillText(fmtValue(view.metric, max), x0 + w, 24);
  ctx.textAlign = 'center';
  const label = { bytes: 'bytes sent', seconds: 'time in collectives', busbw: 'bytes / time' };
  ctx.fillText(label[view.metric], x0 + w / 2, 24);
}

function heatmapHover(ev) {
  const c = view.cells;
  const tip = $('hm-tip');
  if (!c) return;
  const cv = $('heatmap');
  const r = cv.getBoundingClientRect();
  const x = ((ev.clientX - r.left) * cv.width) / r.width;
  const y = ((ev.clientY - r.top) * cv.height) / r.height;
  const j = Math.floor((x - c.pad) / c.cell);
  const i = Math.floor((y - c.pad) / c.cell);
  if (i < 0 || j < 0 || i >= c.n || j >= c.n) {
    tip.textContent = 'row: sending rank, column: receiving rank';
    return;
  }
  tip.textContent = `rank ${i} \u2192 rank ${j}: ${fmtValue(view.metric, c.vals[i * c.n + j])}`;
}

// --- timeline ------------------------------------------------------------------------------

function drawTimeline() {
  const snap = view.snap;
  const cv = $('timeline');
  const tl = snap.timeline;
  const n = snap.info.nranks;
  const lane = 22;
  const left = 54;
  const want = Math.max(60, n * lane + 30);
  if (cv.height !== want) cv.height = want;
  const wantW = Math.max(320, Math.floor(cv.parentElement.clientWidth - 30));
  if (cv.width !== wantW) cv.width = wantW;
  const ctx = cv.getContext('2d');
  const W = cv.width;
  ctx.fillStyle = cssVar('--card') || '#fff';
  ctx.fillRect(0, 0, W, cv.height);
  cv.dataset.step = String(tl.step);
  cv.dataset.spans = String(tl.spans.length);
  $('tl-step').textContent = tl.step >= 0 ? `step ${tl.step}, ${fmtSeconds(tl.wall_s)}` : '';
  if (tl.step < 0 || !(tl.wall_s > 0)) {
    ctx.fillStyle = cssVar('--muted');
    ctx.font = '13px system-ui, sans-serif';
    ctx.fillText('no complete step recorded yet', 20, 30);
    return;
  }
  const scale = (W - left - 10) / tl.wall_s;
  const colours = [cssVar('--compute'), cssVar('--comm')];
  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'middle';
  for (let r = 0; r < n; r++) {
    ctx.fillStyle = cssVar('--idle');
    ctx.fillRect(left, 4 + r * lane, W - left - 10, lane - 6);
    ctx.fillStyle = cssVar('--muted');
    ctx.fillText(`rank ${r}`, 4, 4 + r * lane + (lane - 6) / 2);
  }
  for (const s of tl.spans) {
    if (s.rank >= n) continue;
    ctx.fillStyle = colours[s.kind === 'comm' ? 1 : 0];
    const x = left + s.t0 * scale;
    const w = Math.max(1, (s.t1 - s.t0) * scale);
    ctx.fillRect(x, 4 + s.rank * lane, w, lane - 6);
  }
  // time axis
  const y = 4 + n * lane + 10;
  ctx.fillStyle = cssVar('--muted');
  ctx.textAlign = 'left';
  ctx.fillText('0', left, y);
  ctx.textAlign = 'right';
  ctx.fillText(fmtSeconds(tl.wall_s), W - 10, y);
  ctx.textAlign = 'left';
}

// --- pipeline ------------------------------------------------------------------------------

// Micro-batch j's hue: the golden angle apart, so neighbours (drawn side by side) differ.
function mbColour(j, light) {
  const hue = Math.round((j * 137.508) % 360);
  return `hsl(${hue}, 62%, ${light ? 78 : 48}%)`;
}

function fmtPct(x) { return Number.isFinite(x) ? (x * 100).toFixed(1) + '%' : '-'; }

// A pipeline block: F solid, B hatched, W striped, all in the micro-batch's colour, with its
// label ("F3", "B3.1") when it fits.
function drawBlock(ctx, b, x, y, w, h, v) {
  const c = mbColour(b.mb, false);
  if (b.action === 'F') {
    ctx.fillStyle = c;
    ctx.fillRect(x, y, w, h);
  } else {
    ctx.fillStyle = mbColour(b.mb, true);
    ctx.fillRect(x, y, w, h);
    ctx.save();
    ctx.beginPath();
    ctx.rect(x, y, w, h);
    ctx.clip();
    ctx.strokeStyle = c;
    ctx.lineWidth = b.action === 'B' ? 2 : 1;
    const gap = b.action === 'B' ? 5 : 3;
    for (let k = -h; k < w; k += gap) {
      ctx.beginPath();
      if (b.action === 'B') {
        ctx.moveTo(x + k, y + h);
        ctx.lineTo(x + k + h, y);
      } else {
        ctx.moveTo(x + k, y);
        ctx.lineTo(x + k, y + h);
      }
      ctx.stroke();
    }
    ctx.restore();
    ctx.strokeStyle = c;
    ctx.lineWidth = 1;
    ctx.strokeRect(x + 0.5, y + 0.5, Math.max(0, w - 1), h - 1);
  }
  const label = b.action + b.mb + (v > 1 ? '.' + b.chunk : '');
  if (ctx.measureText(label).width + 4 <= w) {
    ctx.fillStyle = b.action === 'F' ? '#fff' : cssVar('--ink');
    ctx.fillText(label, x + 2, y + h / 2);
  }
}

// Shown only when the run has a pipeline (snapshot.pipeline is null otherwise).
function drawPipeline() {
  const snap = view.snap;
  const pl = snap.pipeline;
  const ps = snap.analysis.pipeline;
  const sec = $('sec-pipeline');
  const cv = $('pipeline');
  sec.hidden = !pl;
  cv.dataset.step = String(pl ? pl.step : -1);
  cv.dataset.stages = String(pl ? pl.lanes.length : 0);
  cv.dataset.blocks = String(pl ? pl.blocks.length : 0);
  if (!pl) return;
  const n = pl.lanes.length;
  const lane = 26;
  const left = 70;
  const want = Math.max(60, n * lane + 30);
  if (cv.height !== want) cv.height = want;
  const wantW = Math.max(320, Math.floor(cv.parentElement.clientWidth - 30));
  if (cv.width !== wantW) cv.width = wantW;
  const ctx = cv.getContext('2d');
  const W = cv.width;
  ctx.fillStyle = cssVar('--card') || '#fff';
  ctx.fillRect(0, 0, W, cv.height);
  const v = ps ? ps.virtual_stages : 1;
  $('pp-step').textContent = ps
    ? `step ${pl.step}: ${ps.schedule}, ${n} stages${v > 1 ? ` \u00d7 ${v} virtual` : ''}, ` +
      `${ps.micro_batches} micro-batches, ${fmtSeconds(pl.wall_s)} from the first action to the last`
    : `step ${pl.step}`;
  const scale = (W - left - 10) / (pl.wall_s > 0 ? pl.wall_s : 1);
  ctx.font = '11px system-ui, sans-serif';
  ctx.textBaseline = 'middle';
  for (const l of pl.lanes) {
    const y = 4 + l.stage * lane;
    ctx.fillStyle = cssVar('--idle');
    ctx.fillRect(left, y, W - left - 10, lane - 6);
    ctx.fillStyle = cssVar('--muted');
    ctx.fillText(`stage ${l.stage} r${l.rank}`, 4, y + (lane - 6) / 2);
  }
  for (const b of pl.blocks) {
    if (b.stage >= n) continue;
    const x = left + b.t0 * scale;
    const w = Math.max(1, (b.t1 - b.t0) * scale);
    drawBlock(ctx, b, x, 4 + b.stage * lane, w, lane - 6, v);
  }
  const y = 4 + n * lane + 10;
  ctx.fillStyle = cssVar('--muted');
  ctx.textAlign = 'left';
  ctx.fillText('0', left, y);
  ctx.textAlign = 'right';
  ctx.fillText(fmtSeconds(pl.wall_s), W - 10, y);
  ctx.textAlign = 'left';
  fillTable('pp-bubbles', pl.lanes.map((l) => [`${l.stage}`, `${l.rank}`,
    fmtPct(ps ? ps.last_stage_bubble[l.stage] : NaN), fmtPct(ps ? ps.formula : NaN),
    fmtPct(ps ? ps.stage_bubble[l.stage] : NaN)]));
  const formula = !ps ? '' : ps.schedule === 'interleaved' ? '(p-1)/(v\u00b7m+p-1)'
    : Number.isFinite(ps.formula) ? '(p-1)/(m+p-1)' : 'none for this schedule';
  $('pp-note').textContent = ps
    ? `Bubble = 1 \u2212 busy / the step's span of actions (mean over the stage's ranks); ` +
      `all stages ${fmtPct(ps.last_bubble)} in step ${ps.last_step}, ${fmtPct(ps.bubble)} over ` +
      `the last ${ps.steps} steps; formula ${formula} = ${fmtPct(ps.formula)}.`
    : '';
}

// --- line charts ---------------------------------------------------------------------------

function drawChart(id, hist, key, fmt) {
  const cv = $(id);
  const ctx = cv.getContext('2d');
  const W = cv.width;
  const H = cv.height;
  ctx.fillStyle = cssVar('--card') || '#fff';
  ctx.fillRect(0, 0, W, H);
  const pts = hist.filter((h) => Number.isFinite(h[key]));
  cv.dataset.points = String(pts.length);
  ctx.font = '11px system-ui, sans-serif';
  if (pts.length === 0) {
    ctx.fillStyle = cssVar('--muted');
    ctx.fillText('no data', 20, 30);
    return;
  }
  const l = 56, r = 10, t = 10, b = 24;
  let ymin = Infinity, ymax = -Infinity;
  for (const p of pts) { ymin = Math.min(ymin, p[key]); ymax = Math.max(ymax, p[key]); }
  if (ymax === ymin) { ymax += Math.abs(ymax) * 0.05 || 1; ymin -= Math.abs(ymin) * 0.05 || 1; }
  const x0 = pts[0].step, x1 = Math.max(pts[pts.length - 1].step, x0 + 1);
  const X = (s) => l + ((s - x0) / (x1 - x0)) * (W - l - r);
  const Y = (v) => t + (1 - (v - ymin) / (ymax - ymin)) * (H - t - b);
  ctx.strokeStyle = cssVar('--line');
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(l, t); ctx.lineTo(l, H - b); ctx.lineTo(W - r, H - b);
  ctx.stroke();
  // strategy switches as dashed lines
  ctx.setLineDash([4, 3]);
  ctx.strokeStyle = cssVar('--muted');
  for (let i = 1; i < pts.length; i++) {
    if (pts[i].strategy !== pts[i - 1].strategy) {
      const x = X(pts[i].step);
      ctx.beginPath(); ctx.moveTo(x, t); ctx.lineTo(x, H - b); ctx.stroke();
      ctx.fillStyle = cssVar('--muted');
      ctx.fillText(pts[i].strategy, Math.min(x + 3, W - 80), t + 8);
    }
  }
  ctx.setLineDash([]);
  ctx.strokeStyle = cssVar('--accent');
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  pts.forEach((p, i) => (i ? ctx.lineTo(X(p.step), Y(p[key])) : ctx.moveTo(X(p.step), Y(p[key]))));
  ctx.stroke();
  ctx.fillStyle = cssVar('--muted');
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  ctx.fillText(fmt(ymax), l - 4, t + 4);
  ctx.fillText(fmt(ymin), l - 4, H - b - 4);
  ctx.textAlign = 'left';
  ctx.textBaseline = 'top';
  ctx.fillText(`step ${x0}`, l, H - b + 6);
  ctx.textAlign = 'right';
  ctx.fillText(`step ${pts[pts.length - 1].step}`, W - r, H - b + 6);
  ctx.textAlign = 'left';
}

// --- tables --------------------------------------------------------------------------------

function fillTable(id, rows) {
  const body = $(id).tBodies[0];
  body.textContent = '';
  for (const cells of rows) {
    const tr = document.createElement('tr');
    for (const c of cells) {
      const td = document.createElement('td');
      if (c instanceof Node) td.appendChild(c);
      else td.textContent = c;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function bar(frac) {
  const d = document.createElement('div');
  d.className = 'bar';
  d.style.width = `${Math.max(0, Math.min(1, frac)) * 100}%`;
  return d;
}

function drawTables() {
  const s = view.snap;
  const a = s.analysis;
  fillTable('reshards', a.reshards.map((x) =>
    [x.transition, String(x.count), fmtBytes(x.bytes), fmtSeconds(x.seconds)]));
  let peak = 0;
  for (const m of s.mem) peak = Math.max(peak, m.peak);
  fillTable('memory', s.mem.map((m, r) =>
    [String(r), fmtBytes(m.in_use), fmtBytes(m.peak), fmtBytes(m.params), fmtBytes(m.grads),
      fmtBytes(m.optimizer), fmtBytes(m.activations), m.host_optimizer ? fmtBytes(m.host_optimizer) : '-',
      bar(peak ? m.in_use / peak : 0)]));
  fillTable('overlap', a.overlap.map((o, r) => [String(r), fmtSeconds(o.compute_s),
    fmtSeconds(o.comm_s), fmtSeconds(o.exposed_comm_s), (o.overlap_ratio * 100).toFixed(0) + '%',
    fmtSeconds(o.exposed_comm_step_s || 0),
    o.dp_comm_s > 0 ? (o.dp_hidden_ratio * 100).toFixed(0) + '%' : '-']));
  $('stragglers').textContent = a.stragglers.length
    ? 'Stragglers: ' + a.stragglers.map((x) =>
      `rank ${x.rank} last in ${(x.last_fraction * 100).toFixed(0)}% of collectives ` +
      `(${fmtSeconds(x.mean_lag_s)} behind)`).join('; ')
    : '';
  fillTable('busbw', a.busbw.map((x) => [x.coll, String(x.group_size), fmtBytes(x.bytes),
    String(x.count), fmtSeconds(x.mean_s), fmtGBs(x.busbw_gbs)]));
  fillTable('ops', a.ops.slice(0, 12).map((x) =>
    [x.name, x.phase, String(x.count), fmtSeconds(x.seconds)]));
}

// --- suggestions ---------------------------------------------------------------------------

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawSuggestions() {
  const list = $('suggestions');
  const sugg = view.snap.suggestions;
  const mine = sugg.find((x) => x.id === view.accepted);
  if (mine && mine.state === 'applied') {
    say(`Now running ${mine.target}. ${mine.result || ''}`);
    view.accepted = 0;
  } else if (mine && mine.state === 'refused') {
    say(`The job refused ${mine.target}: ${mine.result || 'no reason given'}`, true);
    view.accepted = 0;
  } else if (mine && mine.state === 'dropped') {
    say(`${mine.target} was not applied: ${mine.result || 'the run ended first'}`, true);
    view.accepted = 0;
  }
  // While the advisor's model disagrees with the measured step it suggests nothing: say why
  // (what it had open stays listed as withdrawn, with the same reason).
  const note = $('advisor-note');
  setText(note, view.snap.advisor_note || '');
  note.hidden = !view.snap.advisor_note;
  $('sugg-empty').hidden = sugg.length > 0 || !!view.snap.advisor_note;
  // Update the list in place, keyed by id: rebuilding it on every snapshot replaced the
  // buttons under the pointer, and a click landing as that happened was lost.
  const old = new Map([...list.children].map((li) => [li.dataset.id, li]));
  let prev = null;
  for (const s of sugg) {
    let li = old.get(String(s.id));
    if (li) old.delete(String(s.id));
    else li = newSuggestion(s.id);
    fillSuggestion(li, s);
    const want = prev ? prev.nextSibling : list.firstChild;
    if (want !== li) list.insertBefore(li, want);
    prev = li;
  }
  for (const li of old.values()) li.remove();
}

// One suggestion's element, built once; fillSuggestion updates its texts and buttons.
function newSuggestion(id) {
  const li = el('li');
  li.dataset.id = String(id);
  const head = el('div', 'head');
  head.append(el('span', 'target'), el('span', 'gain'), el('span', 'state'));
  li.append(head, el('div', 'evidence'), el('div', 'result'));
  return li;
}

function setText(e, text) {
  if (e.textContent !== text) e.textContent = text;
}

function fillSuggestion(li, s) {
  li.dataset.state = s.state;
  setText(li.querySelector('.target'), s.target);
  setText(li.querySelector('.gain'), `${(s.predicted_gain * 100).toFixed(0)}% faster (predicted)`);
  setText(li.querySelector('.state'), s.state);
  setText(li.querySelector('.evidence'), s.evidence);
  const result = li.querySelector('.result');
  setText(result, s.result || '');
  result.hidden = !s.result;
  let btns = li.querySelector('.buttons');
  if (s.state === 'open' && !btns) {
    btns = el('div', 'buttons');
    const acc = el('button', 'primary accept', 'Accept\u2026');
    acc.type = 'button';
    acc.dataset.id = String(s.id);
    acc.dataset.action = 'accept';
    const dis = el('button', 'dismiss', 'Dismiss');
    dis.type = 'button';
    dis.dataset.id = String(s.id);
    dis.dataset.action = 'dismiss';
    btns.append(acc, dis);
    li.appendChild(btns);
  } else if (s.state !== 'open' && btns) {
    btns.remove();
  }
}

function confirmDialog(title, rows, okLabel) {
  const dlg = $('confirm');
  $('cf-title').textContent = title;
  const body = $('cf-body');
  body.textContent = '';
  for (const [k, v] of rows) {
    body.appendChild(el('dt', '', k));
    body.appendChild(el('dd', '', v));
  }
  $('cf-ok').textContent = okLabel;
  return new Promise((resolve) => {
    const done = (ok) => {
      $('cf-ok').onclick = null;
      $('cf-cancel').onclick = null;
      dlg.onclose = null;
      if (dlg.open) dlg.close();
      resolve(ok);
    };
    $('cf-ok').onclick = () => done(true);
    $('cf-cancel').onclick = () => done(false);
    dlg.onclose = () => done(false);
    dlg.showModal();
  });
}

function say(text, isError) {
  const m = $('action-msg');
  m.textContent = text;
  m.classList.toggle('error', !!isError);
}

async function post(path, body) {
  const res = await fetch(path, {
    method: 'POST',
    credentials: 'same-origin',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body || {}),
  });
  let data = {};
  try { data = await res.json(); } catch (e) { /* not JSON */ }
  if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
  return data;
}

async function onSuggestionClick(ev) {
  const btn = ev.target.closest('button[data-action]');
  if (!btn || view.busy) return;
  const id = Number(btn.dataset.id);
  const s = view.snap.suggestions.find((x) => x.id === id);
  if (!s) return;
  if (btn.dataset.action === 'accept') {
    const ok = await confirmDialog(`Switch to ${s.target}?`, [
      ['change', s.diff || `${s.current} \u2192 ${s.target}`],
      ['from', s.current],
      ['to', s.target],
      ['predicted gain', `${(s.predicted_gain * 100).toFixed(1)}% faster steps`],
      ['step time', `${fmtSeconds(s.current_step_s)} \u2192 ${fmtSeconds(s.predicted_step_s)} (predicted)`],
      ['memory', s.memory_check],
      ['why', s.evidence],
    ], 'Switch');
    if (!ok) return;
  }
  view.busy = true;
  try {
    await post(`/api/v1/suggestions/${id}/${btn.dataset.action}`);
    if (btn.dataset.action === 'accept') view.accepted = id;
    say(btn.dataset.action === 'accept'
      ? `Switching to ${s.target} at the next step boundary\u2026` : `Dismissed ${s.target}.`);
  } catch (e) {
    say(`Refused: ${e.message}`, true);
  } finally {
    view.busy = false;
  }
}

async function onStop() {
  const ok = await confirmDialog('Stop training?', [
    ['what', 'Training ends after the current step; the process exits normally.'],
  ], 'Stop training');
  if (!ok) return;
  try {
    await post('/api/v1/stop');
    say('Stopping after the current step\u2026');
  } catch (e) {
    say(`Refused: ${e.message}`, true);
  }
}

// --- the page --------------------------------------------------------------------------------

function drawStatus() {
  const s = view.snap;
  const last = s.history.length ? s.history[s.history.length - 1] : null;
  $('st-step').textContent = s.step >= 0 ? String(s.step) : '-';
  $('st-strategy').textContent = s.strategy || '-';
  $('st-tps').textContent = last ? fmtNum(last.tokens_per_s) : '-';
  $('st-loss').textContent = last ? fmtNum(last.loss, 4) : '-';
  $('st-ranks').textContent = String(s.info.nranks);
  $('st-event').textContent = s.last_event || '';
  // A collective waiting far longer than usual (the flight recorder): a banner naming it and
  // the ranks that have not arrived, before the communicator times out.
  const alert = $('hang-alert');
  alert.textContent = s.hang_alert || '';
  alert.hidden = !s.hang_alert;
  document.title = `meshscope: step ${s.step} \u00b7 ${s.strategy}`;
  if (s.finished) setConn('finished', s.info.live ? 'finished' : 'trace file');
  $('btn-stop').disabled = s.finished;
}

function setConn(state, text) {
  const c = $('st-conn');
  c.dataset.state = state;
  c.textContent = text;
}

function render(snap) {
  if (view.snap && snap.version <= view.snap.version) return;
  view.snap = snap;
  drawStatus();
  drawHeatmap();
  drawTimeline();
  drawPipeline();
  drawChart('chart-loss', snap.history, 'loss', (v) => v.toFixed(3));
  drawChart('chart-tps', snap.history, 'tokens_per_s', (v) => fmtNum(v));
  drawSuggestions();
  drawTables();
}

function connect() {
  const es = new EventSource('/api/v1/events');
  es.addEventListener('open', () => {
    if (!view.snap || !view.snap.finished) setConn('live', 'live');
  });
  es.addEventListener('error', () => {
    if (!view.snap || !view.snap.finished) setConn('reconnecting', 'reconnecting');
  });
  es.addEventListener('snapshot', (ev) => {
    try {
      render(JSON.parse(ev.data));
    } catch (e) {
      say(`Bad snapshot: ${e.message}`, true);
    }
  });
}

async function start() {
  $('hm-metric').addEventListener('change', (e) => { view.metric = e.target.value; if (view.snap) drawHeatmap(); });
  $('hm-dim').addEventListener('change', (e) => { view.dim = e.target.value; if (view.snap) drawHeatmap(); });
  $('heatmap').addEventListener('mousemove', heatmapHover);
  $('suggestions').addEventListener('click', onSuggestionClick);
  $('btn-stop').addEventListener('click', onStop);
  try {
    const res = await fetch('/api/v1/snapshot', { credentials: 'same-origin' });
    if (res.ok) render(await res.json());
  } catch (e) { /* the stream will bring it */ }
  connect();
}

document.addEventListener('DOMContentLoaded', start);
