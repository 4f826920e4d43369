"use strict";
// Polls the admin API (same origin, same credentials) once a second; no build step, no CDN.
const POLL_MS = 1000;
const rows = document.getElementById("rows");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function ago(ts) {
  if (typeof ts !== "number") return "unknown";
  const s = Math.max(0, Math.round(Date.now() / 1000 - ts));
  const when = new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  const span = s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min` : `${Math.floor(s / 3600)} h`;
  return `${when} (${span} ago)`;
}

async function getJSON(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function refresh() {
  const page = await getJSON("/admin/api/desktops?limit=500");
  const details = {};
  await Promise.all(page.desktops
    .filter(d => d.online && d.queue && d.queue.pending_count > 0)
    .map(async d => { details[d.user_id] = await getJSON(`/admin/api/users/${encodeURIComponent(d.user_id)}`); }));
  const body = document.createDocumentFragment();
  let online = 0;
  for (const d of page.desktops) {
    if (d.online) online += 1;
    const queue = d.queue || {};
    const inflight = (details[d.user_id] || {}).in_flight || [];
    // online null: presence in doubt (a call now is answered unavailable)
    const state = d.online === null ? "unknown" : d.online ? "online" : "offline";
    const tools = el("td", { class: "tools" }, ...(d.tools || []).map(t => el("span", {}, t)));
    const jobs = el("td", { class: "jobs" },
      d.online ? `${queue.pending_count ?? 0}` : el("span", { class: "muted" }, "-"),
      ...inflight.map(j => el("code", {}, j)));
    body.append(el("tr", { "data-user": d.user_id, "data-state": state },
      el("td", {}, d.user_id),
      el("td", {}, el("span", { class: `state ${state}` }, state)),
      el("td", {}, ago(d.since)),
      el("td", {}, d.sidecar_version || "-"),
      tools,
      el("td", {}, d.online ? `${queue.length ?? 0}` : "-"),
      jobs));
  }
  rows.replaceChildren(body);
  document.getElementById("summary").textContent =
    `${online} online of ${page.total} desktops seen in the last week · updated ${new Date().toLocaleTimeString()}`;
  document.getElementById("error").textContent = "";
}

async function loop() {
  try { await refresh(); } catch (e) { document.getElementById("error").textContent = String(e); }
  setTimeout(loop, POLL_MS);
}
loop();
