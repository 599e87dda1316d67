// Sentinel's status page: polls /api/v1/status and draws it. No library, no network
// beyond this server (the server's Content-Security-Policy forbids anything else).
"use strict";

const POLL_MS = 2000;
const COLORS = ["#2f5fb3", "#c2185b", "#00897b", "#8e6c00"];
const SEVERITY_COLORS = { critical: "#c62828", warning: "#e07a00", info: "#5e6ad2" };
const CHARTS = [
  { key: "loss", title: "Loss", log: false, fmt: (v) => fmt(v) },
  { key: "grad_norm", title: "Gradient norm", log: true, fmt: (v) => fmt(v) },
  { key: "update_ratio", title: "Update ratio |Δw|/|w|", log: true, fmt: (v) => v.toExponential(1) },
  { key: "learning_rate", title: "Learning rate", log: true, fmt: (v) => v.toExponential(1) },
  { key: "memory_used", title: "Memory used", log: false, fmt: (v) => bytes(v) },
];
let selected = null;
let lastOk = 0;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function fmt(v) {
  if (v === null || v === undefined) return "—";
  if (typeof v === "string") return v;  // "NaN", "Inf", "-Inf": the value is non-finite
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(2) : Number(v.toPrecision(4)).toString();
}

function bytes(v) {
  if (v === null || v === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function ago(s) {
  if (s === null || s === undefined) return "—";
  return s < 1 ? "now" : s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

function badge(text, cls) { return el("span", { class: `badge ${cls || text}` }, text); }

async function poll() {
  const url = "/api/v1/status" + (selected ? `?run=${encodeURIComponent(selected)}` : "");
  try {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    render(await r.json());
    lastOk = Date.now();
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    const since = lastOk ? ` (last update ${Math.round((Date.now() - lastOk) / 1000)} s ago)` : "";
    document.getElementById("updated").textContent = `engine not reachable${since}`;
  }
}

async function loop() {
  await poll();
  setTimeout(loop, POLL_MS);
}

function render(doc) {
  const runs = doc.runs || [];
  document.getElementById("empty").hidden = runs.length > 0;
  selected = doc.selected;
  const select = document.getElementById("run-select");
  const ids = runs.map((r) => r.id).join("\n");
  if (select.dataset.ids !== ids) {
    select.replaceChildren(...runs.map((r) => el("option", { value: r.id }, r.id)));
    select.dataset.ids = ids;
  }
  if (selected) select.value = selected;
  const run = runs.find((r) => r.id === selected);
  const state = document.getElementById("run-state");
  state.textContent = run ? run.state : "";
  state.className = `badge ${run ? run.state : ""}`;
  renderValues(run);
  renderRanks(run);
  renderRuns(runs);
  const alerts = doc.alerts || [];
  renderAlerts(alerts);
  renderCharts(doc.charts || {}, run ? alerts.filter((a) => `${a.job}/${a.run}` === run.id) : []);
  renderGroups(doc.groups || {});
}

function renderValues(run) {
  const box = document.getElementById("keyvalues");
  if (!run) { box.replaceChildren(); return; }
  const r0 = run.ranks[0] || { values: {} };
  const v = r0.values;
  const mem = v.memory_used !== undefined
    ? `${bytes(v.memory_used)}${v.memory_capacity ? " / " + bytes(v.memory_capacity) : ""}` : "—";
  const items = [
    ["step", v.step === undefined ? "—" : String(Math.round(v.step))], ["loss", fmt(v.loss)],
    ["grad norm", fmt(v.grad_norm)], ["update ratio", fmt(v.update_ratio)], ["learning rate", fmt(v.learning_rate)],
    ["step time", v.step_time === undefined ? "—" : `${fmt(v.step_time)} s`], ["memory", mem],
    ["ranks", String(new Set(run.ranks.map((r) => r.rank)).size)],
  ];
  box.replaceChildren(...items.map(([k, val]) => el("div", { "data-key": k }, el("b", {}, val), el("span", {}, k))));
}

function renderRanks(run) {
  const body = document.querySelector("#ranks tbody");
  if (!run) { body.replaceChildren(); return; }
  body.replaceChildren(...run.ranks.map((r) => {
    const v = r.values;
    const who = r.optimizer === undefined ? String(r.rank) : `${r.rank} (optimizer ${r.optimizer})`;
    const state = r.where ? el("td", {}, badge(r.state), el("div", { class: "where" }, `in ${r.where}`))
      : el("td", {}, badge(r.state));
    return el("tr", { "data-rank": r.rank }, el("td", {}, who), state,
      el("td", {}, v.step === undefined ? "—" : Math.round(v.step)), el("td", {}, fmt(v.loss)),
      el("td", {}, fmt(v.grad_norm)), el("td", {}, fmt(v.update_ratio)), el("td", {}, fmt(v.learning_rate)),
      el("td", {}, v.step_time === undefined ? "—" : `${fmt(v.step_time)} s`),
      el("td", {}, bytes(v.memory_used)), el("td", {}, ago(r.seconds_since_step)));
  }));
}

function renderRuns(runs) {
  document.querySelector("#runs tbody").replaceChildren(...runs.map((r) => {
    const steps = r.ranks.map((k) => k.values.step).filter((s) => s !== undefined && s !== null);
    const tr = el("tr", { "data-run": r.id }, el("td", {}, r.id), el("td", {}, badge(r.state)),
      el("td", {}, new Set(r.ranks.map((k) => k.rank)).size), el("td", {}, steps.length ? Math.max(...steps) : "—"));
    tr.style.cursor = "pointer";
    tr.addEventListener("click", () => { selected = r.id; poll(); });
    return tr;
  }));
}

function renderAlerts(alerts) {
  const box = document.getElementById("alerts");
  if (!alerts.length) { box.replaceChildren(el("p", { class: "muted" }, "No alerts.")); return; }
  box.replaceChildren(...alerts.map((a) => {
    const where = [a.ranks && a.ranks.length ? `ranks ${a.ranks.join(", ")}` : "",
      a.optimizers && a.optimizers.length ? `optimizer ${a.optimizers.join(", ")}` : "",
      a.groups && a.groups.length ? `groups ${a.groups.slice(0, 6).join(", ")}` : "",
      (a.started_step ?? a.step) != null ? `since step ${a.started_step ?? a.step}` : ""].filter(Boolean).join(" · ");
    const details = el("details", {}, el("summary", {}, "causes and first checks"),
      el("b", {}, "Likely causes"), el("ul", {}, ...(a.causes || []).map((c) => el("li", {}, c))),
      el("b", {}, "First checks"), el("ul", {}, ...(a.checks || []).map((c) => el("li", {}, c))),
      a.runbook ? el("p", {}, a.runbook) : "");
    if (a.state === "firing") details.open = true;
    return el("div", { class: `alert ${a.state} ${a.severity}`, "data-alert": a.alertname, "data-state": a.state },
      el("div", {}, badge(a.state), " ", badge(a.severity), " ", el("b", {}, a.alertname), " ",
        el("span", { class: "muted" }, `${a.job}/${a.run}${where ? " · " + where : ""}`)),
      el("div", { class: "summary" }, a.summary || ""), details);
  }));
}

function renderCharts(charts, alerts) {
  const box = document.getElementById("charts");
  if (box.children.length !== CHARTS.length) {
    box.replaceChildren(...CHARTS.map((c) => el("div", { class: "chart", id: `chart-${c.key}` },
      el("h3", {}, c.title), svgEl("svg", { "data-chart": c.key, viewBox: "0 0 400 150", preserveAspectRatio: "none" }),
      el("div", { class: "legend" }))));
  }
  let ranksShown = 0;
  for (const c of CHARTS) {
    const lines = (charts[c.key] || {}).ranks || {};
    ranksShown = Math.max(ranksShown, Object.keys(lines).length);
    drawChart(box.querySelector(`#chart-${c.key}`), c, lines, alerts);
  }
  document.getElementById("chart-note").textContent = ranksShown ? `(first ${ranksShown} ranks; dashed: alerts)` : "";
}

function drawChart(div, chart, lines, alerts) {
  const svg = div.querySelector("svg");
  const W = 400, H = 150, L = 46, R = 6, T = 8, B = 18;
  const tf = (v) => (chart.log ? Math.log10(v) : v);
  let pts = [];
  let [x0, x1] = [Infinity, -Infinity];  // the steps of every sample: a non-finite one is a gap
  for (const series of Object.values(lines)) {
    for (const [s, v] of series) {
      x0 = Math.min(x0, s); x1 = Math.max(x1, s);
      if (v !== null && (!chart.log || v > 0)) pts.push([s, tf(v)]);
    }
  }
  svg.replaceChildren();
  const n = pts.length;
  svg.dataset.points = String(n);
  if (!n) {
    svg.dataset.lastStep = "";
    svg.append(Object.assign(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }),
      { textContent: "no data yet" }));
    div.querySelector(".legend").replaceChildren();
    return;
  }
  let [y0, y1] = [Infinity, -Infinity];
  for (const [, v] of pts) { y0 = Math.min(y0, v); y1 = Math.max(y1, v); }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 += 0.5; y0 -= 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  svg.dataset.lastStep = String(x1);
  const X = (s) => L + ((s - x0) / (x1 - x0)) * (W - L - R);
  const Y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  for (const f of [0, 0.5, 1]) {
    const v = y0 + f * (y1 - y0);
    svg.append(svgEl("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }));
    const label = svgEl("text", { x: L - 4, y: Y(v) + 3, "text-anchor": "end", class: "axis" });
    label.textContent = chart.fmt(chart.log ? 10 ** v : v);
    svg.append(label);
  }
  for (const [s, anchor] of [[x0, "start"], [x1, "end"]]) {
    const label = svgEl("text", { x: X(s), y: H - 4, "text-anchor": anchor, class: "axis" });
    label.textContent = `step ${Math.round(s)}`;
    svg.append(label);
  }
  for (const a of alerts) {  // alert markers where each alert began (its latest step before it fired)
    const at = a.started_step ?? a.step;
    if (at === null || at === undefined || at < x0 || at > x1) continue;
    const line = svgEl("line", { x1: X(at), x2: X(at), y1: T, y2: H - B, class: "marker",
      stroke: SEVERITY_COLORS[a.severity] || "#888", "data-marker": a.alertname });
    const title = svgEl("title", {});
    title.textContent = `${a.alertname} (${a.state}) since step ${at}`;
    line.append(title);
    svg.append(line);
  }
  const legend = [];
  Object.entries(lines).forEach(([rank, series], i) => {
    const d = series.filter(([, v]) => v !== null && (!chart.log || v > 0))
      .map(([s, v], j) => `${j ? "L" : "M"}${X(s).toFixed(1)},${Y(tf(v)).toFixed(1)}`).join("");
    if (d) svg.append(svgEl("path", { d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5,
      "vector-effect": "non-scaling-stroke", "data-rank": rank }));
    const sw = el("i", {}); sw.style.background = COLORS[i % COLORS.length];
    const last = series.length ? series[series.length - 1][1] : null;
    legend.push(sw, `rank ${rank}: ${last === null ? "non-finite" : chart.fmt(last)}`);
  });
  div.querySelector(".legend").replaceChildren(...legend);
}

function groupTable(title, rows) {
  return el("div", {}, el("h3", {}, title), el("table", {},
    el("thead", {}, el("tr", {}, el("th", {}, "group"), el("th", {}, "grad norm"), el("th", {}, "param norm"),
      el("th", {}, "update ratio"))),
    el("tbody", {}, ...rows.map((r) => el("tr", { class: r.nonfinite ? "nonfinite" : "", "data-group": r.group },
      el("td", {}, r.group), el("td", {}, r.grad_norm === null ? "NaN/Inf" : fmt(r.grad_norm)),
      el("td", {}, r.param_norm === null ? "NaN/Inf" : fmt(r.param_norm)),
      el("td", {}, r.update_ratio === null ? "NaN/Inf" : fmt(r.update_ratio)))))));
}

function renderGroups(groups) {
  const box = document.getElementById("groups");
  document.getElementById("group-note").textContent = groups.count ? `(${groups.count} groups, max over ranks)` : "";
  const parts = [];
  if (groups.nonfinite && groups.nonfinite.length) parts.push(groupTable("Non-finite now", groups.nonfinite));
  if (groups.largest && groups.largest.length) parts.push(groupTable("Largest gradient norm", groups.largest));
  if (groups.smallest && groups.smallest.length) parts.push(groupTable("Smallest gradient norm", groups.smallest));
  if (!parts.length) parts.push(el("p", { class: "muted" }, "No per-group data yet."));
  box.replaceChildren(el("div", { class: "groups" }, ...parts));
}

document.getElementById("run-select").addEventListener("change", (e) => { selected = e.target.value; poll(); });
loop();
