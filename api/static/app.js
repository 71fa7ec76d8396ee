// IOE page: fetches this API's /api/v1 JSON only and draws inline SVG charts (no libraries).
"use strict";

const ZONE_COLORS = {compute: "#d9534f", hbm_bandwidth: "#f0ad4e", kv_capacity: "#8e44ad",
  network: "#2a7fd4", headroom: "#3c9d5d", saturated: "#b03a2e", unknown: "#7f8c8d"};
const SERIES_COLORS = ["#2a7fd4", "#d9534f", "#3c9d5d", "#f0ad4e", "#8e44ad", "#555"];
const SVGNS = "http://www.w3.org/2000/svg";

// ---------------------------------------------------------------- small helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}
function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  return Number(v.toPrecision(digits)).toString();
}
// A duration in seconds for people: ms under 1 s, then s, then min, then h (never "630.2k ms").
function dur(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  const a = Math.abs(v), sign = v < 0 ? "−" : "";
  if (a === 0) return "0 ms";
  if (a < 1) return sign + Number((a * 1e3).toPrecision(3)) + " ms";
  if (a < 60) return sign + Number(a.toPrecision(3)) + " s";
  if (a < 3600) return sign + Number((a / 60).toPrecision(3)) + " min";
  return sign + Number((a / 3600).toPrecision(3)) + " h";
}
function msToS(v) { return v === null || v === undefined ? null : v / 1e3; }
function hhmm(ns) { return new Date(ns / 1e6).toISOString().slice(11, 16); }
function zoneBadge(zone) {
  const b = el("span", {class: "zone zone-" + (zone || "none")}, zone || "unknown");
  return b;
}
function windowParam() { return document.getElementById("window").value; }

async function api(path) {
  const headers = {};
  const token = sessionStorage.getItem("ioe-token");
  if (token) headers.Authorization = "Bearer " + token;
  const r = await fetch(path, {headers});
  if (r.status === 401) {
    document.getElementById("token-box").hidden = false;
    throw new Error("this server needs a bearer token for reads");
  }
  const body = await r.json();
  if (!r.ok) throw new Error((body.detail && body.detail.message) || JSON.stringify(body.detail));
  return body;
}

// ---------------------------------------------------------------- charts
// Round tick values (1, 2, 2.5 or 5 × 10^k apart) covering [lo, hi], about n of them.
function niceTicks(lo, hi, n = 5) {
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const a = Math.floor(lo / step + 1e-9) * step, b = Math.ceil(hi / step - 1e-9) * step;
  const ticks = [];
  for (let v = a; v <= b + step / 2; v += step) ticks.push(Number(v.toPrecision(12)));
  return {lo: a, hi: b, ticks};
}

// A chart frame: linear scales over the data's extent, axes with a few ticks, a legend.
function frame(title, xs, ys, opts) {
  const W = 560, H = 260, L = 70, R = 14, T = opts.legendRow ? 38 : 24, B = 44;
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title});
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [opts.yZero ? 0 : Math.min(...ys), Math.max(...ys)];
  // one x value: widen by a relative step (x0 + 1 is x0 itself for epoch nanoseconds in a double)
  if (x1 === x0) x1 = x0 + (x0 === 0 ? 1 : Math.abs(x0) * 1e-9);
  if (y1 === y0) y1 = y0 + (y0 === 0 ? 1 : Math.abs(y0) * 0.1);
  const ny = niceTicks(y0, y1);
  [y0, y1] = [ny.lo, ny.hi];
  let xt = [0, 1, 2, 3, 4].map(i => x0 + (x1 - x0) * i / 4);  // time axes: five even ticks
  if (opts.niceX) { const nx = niceTicks(x0, x1); [x0, x1, xt] = [nx.lo, nx.hi, nx.ticks]; }
  const yt = ny.ticks;
  const sx = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const sy = v => H - B - (v - y0) / (y1 - y0) * (H - T - B);
  root.append(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fff", stroke: "#ccc"}));
  const t = svg("text", {x: L, y: 14, class: "title"}); t.textContent = title; root.append(t);
  for (const yv of yt) {
    const yl = svg("text", {x: L - 4, y: sy(yv) + 4, "text-anchor": "end", class: "tick"});
    yl.textContent = (opts.yFmt || fmt)(yv); root.append(yl);
    root.append(svg("line", {x1: L, x2: W - R, y1: sy(yv), y2: sy(yv), stroke: "#eee"}));
  }
  for (const xv of xt) {
    const xl = svg("text", {x: sx(xv), y: H - B + 14, "text-anchor": "middle", class: "tick"});
    xl.textContent = (opts.xFmt || fmt)(xv); root.append(xl);
  }
  if (opts.xLabel) {
    const xl = svg("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", class: "axis-label x-label"});
    xl.textContent = opts.xLabel; root.append(xl);
  }
  if (opts.yLabel) {
    const cy = (T + H - B) / 2;
    const yl = svg("text", {x: 12, y: cy, "text-anchor": "middle", class: "axis-label y-label",
      transform: `rotate(-90 12 ${cy})`});
    yl.textContent = opts.yLabel; root.append(yl);
  }
  return {root, sx, sy, W, H, L, R, T, B, x0, x1, y0, y1};
}

// Series names in a row of their own between the title and the plot (never over the lines).
function legend(f, names) {
  const step = Math.min(130, (f.W - f.L - f.R) / Math.max(names.length, 1));
  names.forEach((n, i) => {
    const x = f.L + i * step;
    f.root.append(svg("rect", {x, y: 21, width: 10, height: 10, fill: SERIES_COLORS[i % 6]}));
    const t = svg("text", {x: x + 14, y: 30, class: "tick legend-name"}); t.textContent = n; f.root.append(t);
  });
}

// The usual distance between consecutive x values (bins): the smallest positive gap that is common.
function medianStep(xs) {
  const u = [...new Set(xs)].sort((a, b) => a - b), d = [];
  for (let i = 1; i < u.length; i++) d.push(u[i] - u[i - 1]);
  if (!d.length) return Infinity;
  d.sort((a, b) => a - b);
  return d[Math.floor(d.length / 2)];
}

function lineChart(title, series, opts = {}) {
  const all = series.flatMap(s => s.points);
  if (!all.length) return el("p", {class: "muted"}, `${title}: no data in this window`);
  const f = frame(title, all.map(p => p[0]), all.map(p => p[1]), {...opts, legendRow: true});
  const gap = 1.5 * (opts.step || medianStep(all.map(p => p[0])));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const pts = [...s.points].sort((a, b) => a[0] - b[0]);
    // a missing bin breaks the line (a new "M") instead of being bridged or drawn as zero
    const d = pts.map((p, j) => `${j && p[0] - pts[j - 1][0] <= gap ? "L" : "M"}${f.sx(p[0]).toFixed(1)},${f.sy(p[1]).toFixed(1)}`).join("");
    f.root.append(svg("path", {d, fill: "none", stroke: SERIES_COLORS[i % 6], "stroke-width": 1.6,
      "stroke-linejoin": "round", class: "series", "data-points": pts.length, "data-name": s.name,
      "data-segments": (d.match(/M/g) || []).length}));
  });
  legend(f, series.map(s => s.name));
  return f.root;
}

// Monotone (non-decreasing) least-squares fit of y on x: pool-adjacent-violators over the points
// sorted by x. Each pooled block is level at its mean y from its first to its last x, so the line
// spans every dot.
function monotoneFit(pts) {
  const sorted = [...pts].sort((a, b) => a[0] - b[0]);
  const blocks = [];
  for (const [x, y] of sorted) {
    blocks.push({lo: x, hi: x, sy: y, n: 1});
    while (blocks.length > 1) {
      const b = blocks[blocks.length - 1], a = blocks[blocks.length - 2];
      if (a.sy / a.n <= b.sy / b.n) break;
      a.hi = b.hi; a.sy += b.sy; a.n += b.n; blocks.pop();
    }
  }
  return blocks.flatMap(b => b.hi > b.lo ? [[b.lo, b.sy / b.n], [b.hi, b.sy / b.n]] : [[b.lo, b.sy / b.n]]);
}

// A vertical marker with a label that stays inside the plot: it flips to the left of the line
// when it would run past the right edge, and `row` stacks labels of markers that sit close.
function marker(f, x, label, cls, row) {
  const px = f.sx(x);
  f.root.append(svg("line", {x1: px, x2: px, y1: f.T, y2: f.H - f.B, stroke: cls === "knee-line" ? "#b3261e" : "#222",
    "stroke-width": 1.4, "stroke-dasharray": "5 3", class: cls, "data-x": x}));
  const width = label.length * 6.2 + 8;
  const right = px + 5 + width <= f.W - f.R;
  const y = f.T + 14 + row * 15;
  const bg = svg("rect", {x: right ? px + 3 : px - 3 - width, y: y - 11, width, height: 14, fill: "#fff",
    "fill-opacity": 0.7, rx: 2, class: cls + "-label-bg"});
  const t = svg("text", {x: right ? px + 7 : px - 7, y, "text-anchor": right ? "start" : "end",
    class: "marker-label " + cls + "-label"});
  t.textContent = label;
  f.root.append(bg, t);
}

const FIT_COLOR = "#e4572e";
function envelopeLegend(f) {
  const y = 14, x = f.W - f.R - 190;  // the title row, right of the title, outside the plot
  const g = svg("g", {class: "legend"});
  g.append(svg("circle", {cx: x + 4, cy: y - 3, r: 2.6, fill: "#2a7fd4"}));
  const a = svg("text", {x: x + 11, y: y + 1, class: "tick"}); a.textContent = "per-bin point"; g.append(a);
  g.append(svg("line", {x1: x + 88, x2: x + 106, y1: y - 3, y2: y - 3, stroke: FIT_COLOR, "stroke-width": 2.4}));
  const b = svg("text", {x: x + 110, y: y + 1, class: "tick"}); b.textContent = "monotone fit"; g.append(b);
  f.root.append(g);
}

function loadPoints(env) {
  const src = env.load_points && env.load_points.length ? env.load_points : env.load_curve;
  return {src, windowed: src === env.load_points};
}

// One envelope panel: the per-bin dots, their monotone fit as a line, Cp and the latency knee.
function envelopePanel(env, title, yOf, opts) {
  const {src, windowed} = loadPoints(env);
  const pts = src.filter(p => p.concurrency > 0 && yOf(p) !== null && yOf(p) !== undefined && Number.isFinite(yOf(p)))
    .map(p => [p.concurrency, yOf(p)]);
  if (!pts.length) return el("p", {class: "muted"}, `${title}: no load points in this window.`);
  const cp = env.cp, knee = cp.latency_knee;
  const marks = [cp.cp, knee, cp.cp_low, cp.cp_high].filter(v => v !== null && v !== undefined);
  const f = frame(title, pts.map(p => p[0]).concat(marks), pts.map(p => p[1]), opts);
  f.root.classList.add("envelope");
  if (opts.zone) {
    const color = ZONE_COLORS[opts.zone] || "#999", left = cp.cp ? f.sx(cp.cp) : f.L;
    f.root.append(svg("rect", {x: left, y: f.T, width: f.W - f.R - left, height: f.H - f.T - f.B,
      fill: color, "fill-opacity": 0.10, class: "zone-shade", "data-zone": opts.zone}));
  }
  if (cp.cp && cp.cp_low !== null && cp.cp_high !== null) {
    f.root.append(svg("rect", {x: f.sx(cp.cp_low), y: f.T, width: Math.max(f.sx(cp.cp_high) - f.sx(cp.cp_low), 1),
      height: f.H - f.T - f.B, fill: "#000", "fill-opacity": 0.06, class: "cp-band"}));
  }
  const fit = monotoneFit(pts);
  const d = fit.map((p, j) => `${j ? "L" : "M"}${f.sx(p[0]).toFixed(1)},${f.sy(p[1]).toFixed(1)}`).join("");
  f.root.append(svg("path", {d: fit.length > 1 ? d : d + "h1", fill: "none", stroke: FIT_COLOR, "stroke-width": 2.4,
    "stroke-opacity": 0.9, "stroke-linejoin": "round", class: "fit", "data-fit": "monotone", "data-vertices": fit.length}));
  const dots = svg("g", {class: "dots", "data-source": windowed ? "window" : "history"});
  for (const [x, y] of pts) {
    dots.append(svg("circle", {cx: f.sx(x).toFixed(1), cy: f.sy(y).toFixed(1), r: 2.3, fill: "#2a7fd4",
      "fill-opacity": 0.6, class: "pt"}));
  }
  f.root.append(dots);
  envelopeLegend(f);
  let row = 0;
  if (cp.cp) marker(f, cp.cp, `Cp ≈ ${fmt(cp.cp)} req`, "cp-line", row++);
  else if (cp.cp_lower_bound) {
    const label = `Cp not reached (> ${fmt(cp.cp_lower_bound)} req)`, width = label.length * 6.2 + 8;
    f.root.append(svg("rect", {x: f.W - f.R - 3 - width, y: f.T + 3, width, height: 14, fill: "#fff",
      "fill-opacity": 0.85, rx: 2}));
    const t = svg("text", {x: f.W - f.R - 7, y: f.T + 14, "text-anchor": "end", class: "marker-label cp-none"});
    t.textContent = label; f.root.append(t); row++;
  }
  if (knee) {
    // below the Cp label when the two sit close, and below the "not reached" note always
    const apart = cp.cp && Math.abs(f.sx(knee) - f.sx(cp.cp)) >= 150;
    marker(f, knee, `latency knee ≈ ${fmt(knee)} req`, "knee-line", apart ? 0 : row);
  }
  return f.root;
}

function envelopeChart(env) {
  const zone = env.envelope.primary;
  const {src, windowed} = loadPoints(env);
  if (!src.length) return el("p", {class: "muted"}, "No load history to fit Cp on.");
  const x = "running requests (concurrency, req)";
  const note = el("p", {class: "muted small"},
    `${src.length} ${windowed ? "bins of this window" : "60 s bins of the last 24 h"}; line: monotone fit of the dots; ` +
    `Cp and the latency knee: hinge fits over the last 24 h (${env.cp.points} load levels). Zone: ${zone}.`);
  return el("div", {class: "envelope-charts"},
    envelopePanel(env, "Throughput per GPU vs load", p => p.tokens_per_s_per_gpu,
      {yZero: true, niceX: true, xLabel: x, yLabel: "throughput (tokens/s per GPU)", zone}),
    envelopePanel(env, "ITL p99 vs load", p => p.itl_p99_s,
      {yZero: true, niceX: true, xLabel: x, yLabel: "ITL p99 (bucket estimate)", yFmt: dur}),
    note);
}

function heatmap(cells) {
  if (!cells.length) return el("p", {class: "muted"}, "No collective records in this window.");
  const ranks = [...new Set(cells.map(c => c.rank))].sort((a, b) => a - b);
  const wins = [...new Set(cells.map(c => c.window_start_ns))].sort((a, b) => a - b);
  const W = 560, L = 56, T = 22, cw = (W - L - 12) / wins.length, ch = 16, H = T + ranks.length * ch + 24;
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart heat", role: "img", "aria-label": "straggler heat map"});
  const t = svg("text", {x: L, y: 14, class: "title"}); t.textContent = "Blame share per rank × time"; root.append(t);
  ranks.forEach((r, i) => {
    const lab = svg("text", {x: L - 4, y: T + i * ch + 12, "text-anchor": "end", class: "tick"});
    lab.textContent = `rank ${r}`; root.append(lab);
  });
  for (const c of cells) {
    const x = L + wins.indexOf(c.window_start_ns) * cw, y = T + ranks.indexOf(c.rank) * ch;
    const rect = svg("rect", {x: x.toFixed(1), y, width: Math.max(cw - 0.5, 0.5).toFixed(1), height: ch - 1,
      fill: "#d9534f", "fill-opacity": (0.05 + 0.95 * Math.min(Math.max(c.share, 0), 1)).toFixed(3), class: "cell"});
    const tip = svg("title", {}); tip.textContent = `rank ${c.rank}: share ${fmt(c.share)}`; rect.append(tip);
    root.append(rect);
  }
  return root;
}

// ---------------------------------------------------------------- views
function table(headers, rows) {
  const t = el("table", {}, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))));
  const body = el("tbody");
  rows.forEach(r => body.append(el("tr", {}, ...r.map(c => el("td", {}, c)))));
  t.append(body);
  return t;
}

async function overview(main) {
  const data = await api(`/api/v1/deployments?window=${windowParam()}`);
  const rows = data.deployments.map(d => {
    const g = d.glance || {};
    const link = el("a", {href: `/deployments/${encodeURIComponent(d.deployment.name)}`}, d.deployment.name);
    return [link, zoneBadge(g.zone), fmt(g.confidence, 2), dur(g.ttft_p99_s), dur(g.itl_p99_s),
      fmt(g.kv_sequences_left), fmt(g.cp), g.stragglers === null || g.stragglers === undefined ? "–" : String(g.stragglers),
      g.error || ""];
  });
  main.replaceChildren(el("h1", {}, "Deployments"),
    table(["deployment", "zone", "confidence", "TTFT p99", "ITL p99", "KV seqs left", "Cp", "stragglers", ""], rows));
  main.dataset.ready = "1";
}

// Evidence verdicts: pass (the signal meets the zone's rule), near, fail, n/a; each with a symbol
// so that colour is never the only cue.
const VERDICTS = {pass: ["v-pass", "✓ pass"], near: ["v-near", "≈ near"], fail: ["v-fail", "✗ fail"],
  "n/a": ["v-na", "– n/a"]};
function verdictBadge(v) {
  const [cls, text] = VERDICTS[v] || ["v-na", v];
  return el("span", {class: "verdict-badge " + cls, "data-verdict": v}, text);
}

// Latency quantiles per bin, dropping bins that saw under a tenth of the series' median number of
// observations: a quantile of a near-empty bin is noise, not a change in latency.
function latencySeries(lat, concept) {
  const rows = lat.series.filter(r => r.concept === concept && r.value_s !== null && r.observations > 0);
  const obs = rows.map(r => r.observations).sort((a, b) => a - b);
  const floor = obs.length ? 0.1 * obs[Math.floor(obs.length / 2)] : 0;
  return bySeries(rows.filter(r => r.observations >= floor), "bin_start_ns", "value_s", r => `p${Math.round(r.q * 100)}`)
    .map(s => ({name: `${concept.split("_")[0].toUpperCase()} ${s.name}`, points: s.points}));
}

function section(title, ...content) {
  return el("section", {}, el("h2", {}, title), ...content);
}

function bySeries(rows, key, val, pick) {
  const out = {};
  for (const r of rows) {
    const name = pick(r);
    if (name === null || r[val] === null) continue;
    (out[name] = out[name] || []).push([r[key], r[val]]);
  }
  return Object.entries(out).map(([name, points]) => ({name, points}));
}

async function deploymentView(main, name) {
  const q = `window=${windowParam()}`, base = `/api/v1/deployments/${encodeURIComponent(name)}`;
  const [env, lat, gpu, fab, strag, ph] = await Promise.all([
    api(`${base}/envelope?${q}`), api(`${base}/latency?${q}`), api(`${base}/gpu?${q}`),
    api(`${base}/fabric?${q}`), api(`${base}/stragglers?${q}`), api(`${base}/phases?${q}`)]);
  const v = env.envelope;
  const head = el("div", {class: "verdict"}, el("h1", {}, name), zoneBadge(v.primary),
    v.label && v.label !== v.primary ? el("span", {class: "verdict-label"}, ` ${v.label}`) : "",
    el("span", {}, ` confidence ${fmt(v.confidence, 2)}`), v.secondary ? el("span", {}, " · secondary ", zoneBadge(v.secondary)) : "",
    (v.notes || []).length > 1 ? el("p", {class: "verdict-notes"}, v.notes.slice(1).join(" · ")) : "");
  const evidence = table(["zone", "signal", "value", "unit", "rule", "verdict", "source"],
    v.evidence.filter(e => e.verdict !== "info").map(e => [e.zone, e.signal, fmt(e.value), e.unit, e.compared_with,
      verdictBadge(e.verdict), e.source]));
  const room = env.headroom;
  const roomTable = table(["KV sequences left", "HBM BW left", "fabric left", "TTFT SLO margin", "ITL SLO margin"],
    [[fmt(room.kv_sequences_left), fmt(room.hbm_bandwidth_left_ratio), fmt(room.fabric_left_ratio),
      dur(room.ttft_slo_margin_s), dur(room.itl_slo_margin_s)]]);
  const regr = regressionView(env.regression);
  const tfmt = {xFmt: hhmm, yFmt: dur, step: lat.bin_s * 1e9, xLabel: "time (UTC)"};
  const gpuSeries = bySeries(gpu.series, "bin_start_ns", "mean", r => r.metric.replace("_ratio", ""));
  const linkSeries = bySeries(fab.links, "bin_start_ns", "mean", r => r.metric.replace("_bytes_per_s", ""))
    .concat(bySeries(fab.ports, "bin_start_ns", "mean", r => "ib " + r.metric));
  main.replaceChildren(head,
    section("Envelope", el("div", {id: "chart-envelope"}, envelopeChart(env)),
      el("div", {class: "tables"}, roomTable, regr)),
    section("Evidence", evidence, el("p", {class: "muted"}, ...v.missing.map(m => el("div", {}, "missing: " + m)))),
    section("Latency (bucket estimates)", el("div", {class: "grid"},
      el("div", {id: "chart-ttft"}, lineChart("TTFT", latencySeries(lat, "ttft_seconds"), {...tfmt, yLabel: "TTFT"})),
      el("div", {id: "chart-itl"}, lineChart("ITL", latencySeries(lat, "itl_seconds"), {...tfmt, yLabel: "ITL"})))),
    section("Request phases", el("div", {id: "phases"}, phasesView(ph))),
    section("GPU and fabric", el("div", {class: "grid"},
      el("div", {id: "chart-gpu"}, lineChart("GPU activity (mean over GPUs)", gpuSeries,
        {xFmt: hhmm, yZero: true, step: gpu.bin_s * 1e9, xLabel: "time (UTC)", yLabel: "active ratio (0–1)"})),
      el("div", {id: "chart-fabric"}, lineChart("Fabric bytes/s", linkSeries,
        {xFmt: hhmm, yZero: true, step: fab.bin_s * 1e9, xLabel: "time (UTC)", yLabel: "bytes/s", yFmt: v => fmt(v) + "B/s"})))),
    section("Stragglers", el("div", {id: "chart-heat"}, heatmap(strag.heatmap)),
      table(["rank", "kind", "persistence", "blame share", "host", "gpu", "cause"],
        strag.stragglers.map(s => [s.rank, s.kind, fmt(s.persistence, 2), fmt(s.blame_share, 2), s.host, s.gpu, s.cause]))),
    section("Plan", el("div", {id: "plan"}, el("p", {class: "muted"}, "planning…"))));
  main.dataset.ready = "1";
  await planView(document.getElementById("plan"), base);
}

// Request phases: what TTFT is made of (means over the request spans, exact for the requests seen)
// as one stacked bar, and each phase's quantiles labelled exact (spans) or bucket estimate.
const PART_COLORS = {queue: "#8e44ad", prefill: "#2a7fd4", kv_transfer: "#d9534f", other: "#9aa3ad"};
function pct(v) { return v === null || v === undefined ? "–" : `${Number((100 * v).toPrecision(3))} %`; }
function ttftBar(d, parts) {
  const W = 560, L = 8, R = 8, T = 22, H = 56, w = W - L - R;
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart ttft-bar", role: "img",
    "aria-label": "TTFT decomposition"});
  const t = svg("text", {x: L, y: 14, class: "title"});
  t.textContent = `Mean TTFT ${dur(d.ttft.mean_s)} (p99 ${dur(d.ttft.p99_s)}), from request spans`; root.append(t);
  let x = L;
  for (const k of parts) {
    const share = Math.max(0, Math.min(1, d[k].share)), width = share * w;
    const rect = svg("rect", {x: x.toFixed(1), y: T, width: Math.max(width, 0).toFixed(1), height: H - T - 6,
      fill: PART_COLORS[k], class: "part", "data-part": k, "data-share": share});
    const tip = svg("title", {}); tip.textContent = `${k}: ${dur(d[k].mean_s)} (${pct(share)})`; rect.append(tip);
    root.append(rect);
    if (width > 70) {
      const lab = svg("text", {x: x + 4, y: T + 20, class: "tick part-label"});
      lab.textContent = `${k} ${pct(share)}`; lab.setAttribute("fill", "#fff"); root.append(lab);
    }
    x += width;
  }
  return root;
}
function phasesView(ph) {
  const d = ph.ttft_decomposition || {};
  const parts = ["queue", "prefill", "kv_transfer", "other"].filter(k => d[k]);
  const label = p => p.source === "spans" ? "exact (spans)" : "bucket estimate";
  const quantiles = table(["phase", "p50", "p90", "p99", "mean", "requests", "source"],
    ph.phases.map(p => [p.phase.replace(/_s$/, ""), dur(p.quantiles_s.p50), dur(p.quantiles_s.p90),
      dur(p.quantiles_s.p99), dur(p.mean_s), fmt(p.count),
      el("span", {class: "phase-source", "data-source": p.source}, label(p))]));
  const shares = parts.length ? table(["part of TTFT", "mean", "share"],
    parts.map(k => [k, dur(d[k].mean_s), pct(d[k].share)])) : "";
  const kv = ph.kv_transfer_share_of_ttft;
  return el("div", {class: "phases", "data-requests": ph.requests},
    parts.length ? ttftBar(d, parts) : el("p", {class: "muted no-decomposition"}, "No TTFT decomposition: " + ph.note),
    el("div", {class: "tables"}, shares, quantiles),
    kv !== null && kv !== undefined ? el("p", {class: "small kv-share"},
      `KV transfer is ${pct(kv)} of mean TTFT: in a disaggregated deployment, the network's part of the user's wait.`) : "",
    el("p", {class: "muted small"}, parts.length
      ? `${ph.requests} request spans; the bar splits mean TTFT (means add up, quantiles do not); ` +
        "other = what the spans do not break down."
      : ph.note));
}

// p99 regressions: the baseline actually compared with (and why, after a fallback), and the axes
// that moved, the one that moved first marked.
function regressionView(reg) {
  const used = reg.baseline_mode_used || reg.baseline;
  const rows = table(["metric", "p99 now", `p99 baseline (${used})`, "ratio", "verdict"],
    reg.metrics.map(m => [m.metric, dur(m.now_s), dur(m.baseline_s), fmt(m.ratio), m.verdict]));
  const moved = reg.axes.filter(a => a.moved).map(a =>
    `${a.axis}${a.axis === reg.moved_first ? " (moved first)" : ""} ${a.change_ratio > 0 ? "+" : ""}${fmt(100 * a.change_ratio, 2)} %`);
  return el("div", {class: "regression", "data-baseline": used},
    rows,
    moved.length ? el("p", {class: "small moved-axes"}, "axes moved: " + moved.join(", ")) : "",
    reg.fallback_reason ? el("p", {class: "muted small fallback"}, `baseline ${used}: ${reg.fallback_reason}`) : "");
}

async function planView(box, base) {
  try {
    const p = await api(`${base}/plan`);
    box.replaceChildren(el("p", {}, p.change),
      table(["layout", "goodput tok/s/GPU", "TTFT", "TPOT", "wall", "why"],
        p.candidates.map(c => [c.layout, fmt(c.goodput_tok_s_per_gpu), dur(msToS(c.ttft_ms)), dur(msToS(c.tpot_ms)), c.wall,
          (c.reasons || []).join("; ")])));
  } catch (err) {
    box.replaceChildren(el("p", {class: "muted"}, "No plan: " + err.message));
  }
  box.dataset.ready = "1";
}

async function render() {
  const main = document.getElementById("main");
  delete main.dataset.ready;
  const m = location.pathname.match(/^\/deployments\/(.+)$/);  // a name may hold "/" (%2F)
  try {
    if (m) await deploymentView(main, decodeURIComponent(m[1]));
    else await overview(main);
  } catch (err) {
    main.replaceChildren(el("p", {class: "error"}, "Could not load: " + err.message));
    main.dataset.ready = "error";
  }
}

document.getElementById("window").addEventListener("change", render);
document.getElementById("token-save").addEventListener("click", () => {
  sessionStorage.setItem("ioe-token", document.getElementById("token").value);
  document.getElementById("token-box").hidden = true;
  render();
});
render();
