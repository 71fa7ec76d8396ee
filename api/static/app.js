// IOE page: fetches this API's /api/v1 JSON only and draws inline SVG charts (no libraries).
"use strict";

const ZONE_COLORS = {compute: "#d9534f", hbm_bandwidth: "#f0ad4e", kv_capacity: "#8e44ad",
  network: "#2a7fd4", headroom: "#3c9d5d"};
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
function ms(v) { return v === null || v === undefined ? "–" : fmt(v * 1e3) + " ms"; }
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
// A chart frame: linear scales over the data's extent, axes with a few ticks, a legend.
function frame(title, xs, ys, opts) {
  const W = 560, H = 240, L = 56, R = 12, T = 22, B = 30;
  const root = svg("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title});
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [opts.yZero ? 0 : Math.min(...ys), Math.max(...ys)];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + (y0 === 0 ? 1 : Math.abs(y0) * 0.1);
  const sx = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const sy = v => H - B - (v - y0) / (y1 - y0) * (H - T - B);
  root.append(svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fff", stroke: "#ccc"}));
  const t = svg("text", {x: L, y: 14, class: "title"}); t.textContent = title; root.append(t);
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + (y1 - y0) * i / 4, xv = x0 + (x1 - x0) * i / 4;
    const yl = svg("text", {x: L - 4, y: sy(yv) + 4, "text-anchor": "end", class: "tick"});
    yl.textContent = (opts.yFmt || fmt)(yv); root.append(yl);
    root.append(svg("line", {x1: L, x2: W - R, y1: sy(yv), y2: sy(yv), stroke: "#eee"}));
    const xl = svg("text", {x: sx(xv), y: H - B + 14, "text-anchor": "middle", class: "tick"});
    xl.textContent = (opts.xFmt || fmt)(xv); root.append(xl);
  }
  if (opts.xLabel) {
    const xl = svg("text", {x: W - R, y: H - 2, "text-anchor": "end", class: "tick"});
    xl.textContent = opts.xLabel; root.append(xl);
  }
  return {root, sx, sy, W, H, L, R, T, B, x0, x1, y0, y1};
}

function legend(f, names) {
  names.forEach((n, i) => {
    const x = f.L + 8 + i * 130;
    f.root.append(svg("rect", {x, y: f.T + 4, width: 10, height: 10, fill: SERIES_COLORS[i % 6]}));
    const t = svg("text", {x: x + 14, y: f.T + 13, class: "tick"}); t.textContent = n; f.root.append(t);
  });
}

function lineChart(title, series, opts = {}) {
  const all = series.flatMap(s => s.points);
  if (!all.length) return el("p", {class: "muted"}, `${title}: no data in this window`);
  const f = frame(title, all.map(p => p[0]), all.map(p => p[1]), opts);
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${f.sx(p[0]).toFixed(1)},${f.sy(p[1]).toFixed(1)}`).join("");
    f.root.append(svg("path", {d, fill: "none", stroke: SERIES_COLORS[i % 6], "stroke-width": 1.6,
      class: "series", "data-points": s.points.length, "data-name": s.name}));
  });
  legend(f, series.map(s => s.name));
  return f.root;
}

function envelopeChart(env) {
  const pts = env.load_curve.map(p => [p.concurrency, p.tokens_per_s_per_gpu]);
  if (!pts.length) return el("p", {class: "muted"}, "No load history to fit Cp on.");
  const cp = env.cp, zone = env.envelope.primary;
  const f = frame("Throughput per GPU vs concurrency", pts.map(p => p[0]).concat(cp.cp ? [cp.cp] : []),
    pts.map(p => p[1]), {yZero: true, xLabel: "running requests"});
  const color = ZONE_COLORS[zone] || "#999";
  const left = cp.cp ? f.sx(cp.cp) : f.L;
  f.root.append(svg("rect", {x: left, y: f.T, width: f.W - f.R - left, height: f.H - f.T - f.B,
    fill: color, "fill-opacity": 0.12, class: "zone-shade", "data-zone": zone}));
  if (cp.cp) {
    if (cp.cp_low !== null && cp.cp_high !== null) {
      f.root.append(svg("rect", {x: f.sx(cp.cp_low), y: f.T, width: Math.max(f.sx(cp.cp_high) - f.sx(cp.cp_low), 1),
        height: f.H - f.T - f.B, fill: "#000", "fill-opacity": 0.06}));
    }
    f.root.append(svg("line", {x1: f.sx(cp.cp), x2: f.sx(cp.cp), y1: f.T, y2: f.H - f.B, stroke: "#222",
      "stroke-dasharray": "4 3", class: "cp-line", "data-cp": cp.cp}));
    const t = svg("text", {x: f.sx(cp.cp) + 4, y: f.T + 14, class: "tick"});
    t.textContent = `Cp ≈ ${fmt(cp.cp)}`; f.root.append(t);
  }
  for (const [x, y] of pts) {
    f.root.append(svg("circle", {cx: f.sx(x).toFixed(1), cy: f.sy(y).toFixed(1), r: 2.4, fill: "#2a7fd4", class: "pt"}));
  }
  const z = svg("text", {x: f.W - f.R - 4, y: f.T + 14, "text-anchor": "end", class: "tick"});
  z.textContent = `zone: ${zone}`; f.root.append(z);
  return f.root;
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
    return [link, zoneBadge(g.zone), fmt(g.confidence, 2), ms(g.ttft_p99_s), ms(g.itl_p99_s),
      fmt(g.kv_sequences_left), fmt(g.cp), g.stragglers === null || g.stragglers === undefined ? "–" : String(g.stragglers),
      g.error || ""];
  });
  main.replaceChildren(el("h1", {}, "Deployments"),
    table(["deployment", "zone", "confidence", "TTFT p99", "ITL p99", "KV seqs left", "Cp", "stragglers", ""], rows));
  main.dataset.ready = "1";
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
  const [env, lat, gpu, fab, strag] = await Promise.all([
    api(`${base}/envelope?${q}`), api(`${base}/latency?${q}`), api(`${base}/gpu?${q}`),
    api(`${base}/fabric?${q}`), api(`${base}/stragglers?${q}`)]);
  const v = env.envelope;
  const head = el("div", {class: "verdict"}, el("h1", {}, name), zoneBadge(v.primary),
    el("span", {}, ` confidence ${fmt(v.confidence, 2)}`), v.secondary ? el("span", {}, " · secondary ", zoneBadge(v.secondary)) : "");
  const evidence = table(["zone", "signal", "value", "unit", "rule", "verdict", "source"],
    v.evidence.filter(e => e.verdict !== "info").map(e => [e.zone, e.signal, fmt(e.value), e.unit, e.compared_with,
      el("span", {class: "v-" + e.verdict.replace("/", "")}, e.verdict), e.source]));
  const room = env.headroom;
  const roomTable = table(["KV sequences left", "HBM BW left", "fabric left", "TTFT SLO margin", "ITL SLO margin"],
    [[fmt(room.kv_sequences_left), fmt(room.hbm_bandwidth_left_ratio), fmt(room.fabric_left_ratio),
      ms(room.ttft_slo_margin_s), ms(room.itl_slo_margin_s)]]);
  const regr = table(["metric", "p99 now", "p99 baseline", "ratio", "verdict"],
    env.regression.metrics.map(m => [m.metric, ms(m.now_s), ms(m.baseline_s), fmt(m.ratio), m.verdict]));
  const latSeries = c => bySeries(lat.series.filter(r => r.concept === c), "bin_start_ns", "value_s", r => `p${Math.round(r.q * 100)}`)
    .map(s => ({name: `${c.split("_")[0].toUpperCase()} ${s.name}`, points: s.points}));
  const tfmt = {xFmt: hhmm, yFmt: v => ms(v)};
  const gpuSeries = bySeries(gpu.series, "bin_start_ns", "mean", r => r.metric.replace("_ratio", ""));
  const linkSeries = bySeries(fab.links, "bin_start_ns", "mean", r => r.metric.replace("_bytes_per_s", ""))
    .concat(bySeries(fab.ports, "bin_start_ns", "mean", r => "ib " + r.metric));
  main.replaceChildren(head,
    section("Envelope", el("div", {class: "grid"}, el("div", {id: "chart-envelope"}, envelopeChart(env)),
      el("div", {}, roomTable, regr))),
    section("Evidence", evidence, el("p", {class: "muted"}, ...v.missing.map(m => el("div", {}, "missing: " + m)))),
    section("Latency (bucket estimates)", el("div", {class: "grid"},
      el("div", {id: "chart-ttft"}, lineChart("TTFT", latSeries("ttft_seconds"), tfmt)),
      el("div", {id: "chart-itl"}, lineChart("ITL", latSeries("itl_seconds"), tfmt)))),
    section("GPU and fabric", el("div", {class: "grid"},
      el("div", {id: "chart-gpu"}, lineChart("GPU activity (mean over GPUs)", gpuSeries, {xFmt: hhmm, yZero: true})),
      el("div", {id: "chart-fabric"}, lineChart("Fabric bytes/s", linkSeries, {xFmt: hhmm, yZero: true})))),
    section("Stragglers", el("div", {id: "chart-heat"}, heatmap(strag.heatmap)),
      table(["rank", "kind", "persistence", "blame share", "host", "gpu", "cause"],
        strag.stragglers.map(s => [s.rank, s.kind, fmt(s.persistence, 2), fmt(s.blame_share, 2), s.host, s.gpu, s.cause]))),
    section("Plan", el("div", {id: "plan"}, el("p", {class: "muted"}, "planning…"))));
  main.dataset.ready = "1";
  await planView(document.getElementById("plan"), base);
}

async function planView(box, base) {
  try {
    const p = await api(`${base}/plan`);
    box.replaceChildren(el("p", {}, p.change),
      table(["layout", "goodput tok/s/GPU", "TTFT ms", "TPOT ms", "wall", "why"],
        p.candidates.map(c => [c.layout, fmt(c.goodput_tok_s_per_gpu), fmt(c.ttft_ms), fmt(c.tpot_ms), c.wall,
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
