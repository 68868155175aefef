// The web console: a client of the REST admin API like any other. It calls the same
// routes with the token the user gives it (kept for this browser tab only), so it can
// do no more than that token may, and it shows the API's own error messages.
"use strict";

const API = "/admin/v2/scalable";
const REFRESH_MS = 2000;
const ROW_H = 46;
// actionError: a refused split or merge, shown until the next action (a refresh that
// works does not hide it).
const state = { namespace: "", topic: null, previous: null, timer: null, selected: new Set(), actionError: null };

const $ = (id) => document.getElementById(id);

function pathOf(topic) {
  // "topic://tenant/namespace/name" -> "/tenant/namespace/name", each part escaped
  return "/" + topic.replace(/^topic:\/\//, "").split("/").map(encodeURIComponent).join("/");
}

async function api(method, path, payload) {
  const headers = {};
  const token = sessionStorage.getItem("raytopics-token");
  if (token) headers.Authorization = "Bearer " + token;
  const request = { method, headers };
  if (payload !== undefined) {
    headers["Content-Type"] = "application/json";
    request.body = JSON.stringify(payload);
  }
  const reply = await fetch(API + path, request);
  const text = await reply.text();
  const body = text ? JSON.parse(text) : null;
  if (!reply.ok) {
    const what = body && body.message ? body.message : reply.statusText;
    throw new Error(`${method} ${path}: ${reply.status} ${body && body.error ? body.error + ": " : ""}${what}`);
  }
  return body;
}

function showError(err) {
  const box = $("error");
  box.textContent = err ? String(err.message || err) : "";
  box.hidden = !err;
}

// --- topics --------------------------------------------------------------------------

async function listTopics() {
  const list = $("topics");
  const topics = await api("GET", "/" + state.namespace.split("/").map(encodeURIComponent).join("/"));
  list.replaceChildren();
  if (!topics.length) {
    list.innerHTML = `<li class="hint">No topics in ${escapeHtml(state.namespace)}.</li>`;
  }
  for (const topic of topics) {
    const link = document.createElement("a");
    link.href = "#";
    link.textContent = topic.replace(/^topic:\/\//, "");
    link.dataset.topic = topic;
    link.addEventListener("click", (event) => { event.preventDefault(); select(topic); });
    const item = document.createElement("li");
    item.append(link);
    list.append(item);
  }
  return topics;
}

function select(topic) {
  state.topic = topic;
  state.actionError = null;
  state.previous = null;
  state.selected.clear();
  for (const link of document.querySelectorAll("#topics a")) {
    link.classList.toggle("selected", link.dataset.topic === topic);
  }
  location.hash = new URLSearchParams({ ns: state.namespace, topic }).toString();
  refresh();
}

async function refresh() {
  clearTimeout(state.timer);
  if (!state.topic) return;
  const topic = state.topic;
  try {
    const [meta, stats] = await Promise.all([
      api("GET", pathOf(topic)), api("GET", pathOf(topic) + "/stats"),
    ]);
    if (topic !== state.topic) return;
    render(topic, meta, stats);
    showError(state.actionError);
  } catch (err) {
    showError(err);
  }
  state.timer = setTimeout(refresh, REFRESH_MS);
}

// --- drawing -------------------------------------------------------------------------

function render(topic, meta, stats) {
  $("topic").hidden = false;
  $("topic-name").textContent = topic;
  $("topic-summary").textContent =
    `epoch ${meta.epoch} · ${stats.activeSegments} active / ${stats.sealedSegments} sealed segments · ` +
    `${stats.records.toLocaleString()} records`;
  const now = performance.now() / 1000;
  const rates = ratesOf(stats, now);
  drawDag(meta);
  segmentRows(meta, stats, rates);
  subscriptionRows(stats);
  state.previous = { at: now, stats };
}

function depths(segments) {
  const depth = {};
  const of = (id) => {
    if (depth[id] === undefined) {
      const parents = segments[id].parentIds.filter((p) => segments[p]);  // retention prunes
      depth[id] = parents.length ? 1 + Math.max(...parents.map(of)) : 0;
    }
    return depth[id];
  };
  Object.keys(segments).forEach(of);
  return depth;
}

function drawDag(meta) {
  const svg = $("dag");
  const width = svg.clientWidth || 800;
  const segments = meta.segments;
  const depth = depths(segments);
  const rows = 1 + Math.max(0, ...Object.values(depth));
  svg.setAttribute("height", rows * ROW_H + 10);
  svg.setAttribute("viewBox", `0 0 ${width} ${rows * ROW_H + 10}`);
  const x = (hash) => 5 + (hash / 65536) * (width - 10);
  const box = {};
  for (const [id, s] of Object.entries(segments)) {
    box[id] = { x: x(s.hashRange.start), w: x(s.hashRange.end + 1) - x(s.hashRange.start), y: 5 + depth[id] * ROW_H };
  }
  const parts = [];
  for (const [id, s] of Object.entries(segments)) {
    for (const child of s.childIds.filter((c) => box[c])) {
      const a = box[id], b = box[child];
      parts.push(`<line x1="${a.x + a.w / 2}" y1="${a.y + 30}" x2="${b.x + b.w / 2}" y2="${b.y}"/>`);
    }
  }
  for (const [id, s] of Object.entries(segments)) {
    const b = box[id];
    const range = `${hex(s.hashRange.start)}-${hex(s.hashRange.end)}`;
    parts.push(
      `<g class="segment ${s.state}" data-segment="${id}" data-state="${s.state}">` +
      `<title>#${id} ${s.state} [${range}] created at epoch ${s.createdAtEpoch}</title>` +
      `<rect x="${b.x + 1}" y="${b.y}" width="${Math.max(b.w - 2, 2)}" height="30" rx="4"/>` +
      (b.w > 44 ? `<text x="${b.x + 6}" y="${b.y + 13}">#${id}</text>` +
        `<text x="${b.x + 6}" y="${b.y + 26}">${b.w > 90 ? range : ""}</text>` : "") +
      `</g>`);
  }
  svg.innerHTML = parts.join("");
}

function ratesOf(stats, now) {
  const before = state.previous;
  const rates = {};
  for (const [id, seg] of Object.entries(stats.segments)) {
    const old = before && before.stats.segments[id];
    const dt = before ? now - before.at : 0;
    if (!old || dt <= 0) { rates[id] = { in: null, out: null }; continue; }
    const acked = (s) => Object.values(s.subscriptions).reduce((sum, c) => sum + (s.records - c.backlog), 0);
    rates[id] = { in: (seg.records - old.records) / dt, out: (acked(seg) - acked(old)) / dt };
  }
  return rates;
}

// A replicated segment's replicas (stats' "replication"): how many are in sync, and
// each one's role, node and lag in the cell's tooltip.
function replicaSummary(replication) {
  if (!replication) return "";
  const inSync = replication.replicas.filter((r) => r.inSync).length;
  return ` · ${inSync}/${replication.replicas.length} replicas in sync`;
}

function replicaList(replication) {
  if (!replication) return "";
  return replication.replicas
    .map((r) => `${r.role} ${r.replica} on ${r.node || "no live node"}, lag ${r.lag ?? "?"}`
      + (r.filesLost ? `, files lost (${r.filesLost}): rebuilt from its leader` : ""))
    .join("; ") + (replication.unavailable ? ` (${replication.unavailable})` : "");
}

function segmentRows(meta, stats, rates) {
  const body = $("segments").querySelector("tbody");
  body.replaceChildren();
  const ids = Object.keys(meta.segments).map(Number).sort((a, b) => a - b);
  for (const id of ids) {
    const s = meta.segments[id];
    const seg = stats.segments[id] || { records: 0, subscriptions: {} };
    const backlog = Object.values(seg.subscriptions).reduce((sum, c) => sum + c.backlog, 0);
    const active = s.state === "ACTIVE";
    const row = document.createElement("tr");
    row.dataset.segment = id;
    row.innerHTML =
      `<td>${active ? `<input type="checkbox" data-select="${id}" ${state.selected.has(id) ? "checked" : ""}>` : ""}</td>` +
      `<td>#${id}</td><td title="${escapeHtml(replicaList(seg.replication))}">${s.state}${seg.hibernating ? " (asleep)" : ""}${seg.tiered ? " (tiered)" : ""}${replicaSummary(seg.replication)}</td>` +
      `<td>${hex(s.hashRange.start)}-${hex(s.hashRange.end)}</td>` +
      `<td>${s.createdAtEpoch}${s.state === "SEALED" ? "–" + s.sealedAtEpoch : ""}</td>` +
      `<td>${seg.records.toLocaleString()}</td><td>${rate(rates[id] && rates[id].in)}</td>` +
      `<td>${rate(rates[id] && rates[id].out)}</td><td>${backlog.toLocaleString()}</td>` +
      `<td>${active ? `<button data-split="${id}">Split</button>` : ""}</td>`;
    body.append(row);
  }
  for (const button of body.querySelectorAll("[data-split]")) {
    button.addEventListener("click", () => change("split", [Number(button.dataset.split)]));
  }
  for (const box of body.querySelectorAll("[data-select]")) {
    box.addEventListener("change", () => {
      const id = Number(box.dataset.select);
      box.checked ? state.selected.add(id) : state.selected.delete(id);
      $("merge").disabled = state.selected.size < 2;
    });
  }
  for (const id of [...state.selected]) {
    if (!meta.segments[id] || meta.segments[id].state !== "ACTIVE") state.selected.delete(id);
  }
  $("merge").disabled = state.selected.size < 2;
}

function subscriptionRows(stats) {
  const body = $("subscriptions").querySelector("tbody");
  body.replaceChildren();
  const names = Object.keys(stats.subscriptions).sort();
  if (!names.length) body.innerHTML = `<tr><td colspan="6" class="hint">No subscriptions.</td></tr>`;
  for (const name of names) {
    const sub = stats.subscriptions[name];
    // A segment shared by key bucket shows the run of buckets held: #3[0-127/256].
    const parts = sub.buckets || {};
    const share = (consumer, s) => {
      const b = (parts[consumer] || {})[s];
      return b ? `#${s}[${b.start}-${b.end - 1}/${b.count}]` : `#${s}`;
    };
    const held = Object.entries(sub.assignments || {})
      .map(([consumer, segments]) => `${escapeHtml(consumer)}: ${segments.map((s) => share(consumer, s)).join(" ") || "none"}`)
      .join("; ");
    const row = document.createElement("tr");
    row.innerHTML =
      `<td>${escapeHtml(name)}</td><td>${sub.state}</td><td>${sub.consumers}</td>` +
      `<td>${sub.backlog.toLocaleString()}</td><td>${(sub.backlogAgeS || 0).toFixed(1)} s</td>` +
      `<td>${held || '<span class="hint">none</span>'}</td>`;
    body.append(row);
  }
}

// --- changes -------------------------------------------------------------------------

// A split's body from the controls: children starting at the hashes given (hex, comma-
// separated), else this many near-equal children, else none (two halves). A merge of more
// than two names the rest in its body. The API checks both and says what is wrong.
function splitBody() {
  const at = $("split-at").value.trim();
  if (at) {
    const hashes = at.split(",").map((h) => h.trim()).map((h) => (/^(0x)?[0-9a-f]+$/i.test(h) ? parseInt(h, 16) : h));
    return { at: hashes.length === 1 ? hashes[0] : hashes };
  }
  const parts = Number($("split-parts").value);
  return parts > 2 ? { parts } : undefined;
}

async function change(kind, ids) {
  const path = pathOf(state.topic) + (kind === "split" ? `/split/${ids[0]}` : `/merge/${ids[0]}/${ids[1]}`);
  const body = kind === "split" ? splitBody() : (ids.length > 2 ? { moreSegmentIds: ids.slice(2) } : undefined);
  try {
    await api("POST", path, body);
    state.selected.clear();
    state.actionError = null;
  } catch (err) {
    state.actionError = err;
  }
  showError(state.actionError);
  refresh();
}

// --- helpers and start ---------------------------------------------------------------

const hex = (n) => n.toString(16).padStart(4, "0");
const rate = (r) => (r === null || r === undefined ? "–" : Math.round(r).toLocaleString());

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function show(namespace, topic) {
  state.namespace = namespace.replace(/^\/+|\/+$/g, "");
  localStorage.setItem("raytopics-namespace", state.namespace);
  try {
    const topics = await listTopics();
    showError(null);
    if (topic && topics.includes(topic)) select(topic);
  } catch (err) {
    showError(err);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const params = new URLSearchParams(location.hash.slice(1));
  const namespace = params.get("ns") || localStorage.getItem("raytopics-namespace") || "";
  $("namespace").value = namespace;
  $("token").value = sessionStorage.getItem("raytopics-token") || "";
  $("connect").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("raytopics-token", $("token").value.trim());
    show($("namespace").value.trim(), null);
  });
  $("merge").addEventListener("click", () => change("merge", [...state.selected].sort((a, b) => a - b)));
  if (namespace) show(namespace, params.get("topic"));
});
