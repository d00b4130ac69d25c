// shardcall web: one page, no build step. It asks the server for a group's
// view once a second and draws it; between answers it only counts
// quarantines down.
"use strict";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const page = { group: null, view: null, fetchedAt: 0, busy: false, actions: false };
// Beyond this many cells the grid draws small squares without words.
const COMPACT_OVER = 2000;
// The timeline draws at most this many lanes and this much time.
const MAX_LANES = 48;
const TIMELINE_MS = 5 * 60 * 1000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3600000) return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
  return `${(ms / 3600000).toFixed(1)} h`;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function clockTime(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

// One colour per member, the same on every read.
function colour(name) {
  let h = 0;
  for (const c of name || "") h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${h % 360} 55% 68%)`;
}

function showError(text) {
  const e = $("error");
  e.hidden = !text;
  e.textContent = text || "";
  if (text) document.body.dataset.error = "1";
  else delete document.body.dataset.error;
}

async function getJson(url) {
  const r = await fetch(url, { cache: "no-store" });
  let body;
  try {
    body = await r.json();
  } catch (_) {
    throw new Error(`the server answered ${r.status} without a readable body`);
  }
  if (!r.ok) throw new Error(body.error || `the server answered ${r.status}`);
  return body;
}

async function loadGroups() {
  try {
    const g = await getJson("/api/groups");
    const select = $("group");
    select.replaceChildren();
    const wanted = params.get("group") || g.default_group || g.groups[0] || null;
    const names = g.groups.includes(wanted) || !wanted ? g.groups : [wanted, ...g.groups];
    for (const name of names) select.append(el("option", { value: name, selected: name === wanted }, name));
    if (!names.length) {
      showError("This Redis holds no groups yet: start a worker, then reload.");
      document.body.dataset.ready = "1";
    }
    page.group = wanted;
    page.actions = !!g.actions;
  } catch (e) {
    showError(`Could not list the groups: ${e.message}`);
    page.group = params.get("group");
  }
}

async function poll() {
  if (!page.group || page.busy) return;
  page.busy = true;
  try {
    const view = await getJson(`/api/view?group=${encodeURIComponent(page.group)}`);
    page.view = view;
    page.fetchedAt = performance.now();
    showError(null);
    render();
  } catch (e) {
    showError(`${page.group}: ${e.message}`);
  } finally {
    page.busy = false;
    document.body.dataset.ready = "1";
  }
}

// Every partition as one row: owned-mode partitions and ticket-mode tickets.
function allPartitions(status) {
  const lineage = status.lineage || {};
  const owned = (status.partitions || []).map((r) => {
    const held = lineage[r.partition];
    // A partition its lineage holds back (a split or merged partition
    // waiting for its parents) is shown so while it is not owned.
    const phase = held && held.standing === "waiting" && r.phase === "free" ? "held back" : r.phase;
    return {
      id: r.partition, topic: r.topic, phase, holder: r.holder, lag: r.lag,
      leftMs: r.quarantine_left_ms, dead: r.dead_letters || 0, failing: r.failing,
      stopped: r.stopped, held,
      // A restore or warm-up of its local state under way.
      warming: !!r.restore,
      target: r.target && r.target !== r.holder ? r.target : null,
      stateBytes: r.store_bytes ?? r.state_bytes, offset: r.offset,
    };
  });
  const tickets = (status.tickets || []).map((r) => ({
    id: r.partition, topic: r.partition.slice(0, r.partition.lastIndexOf("/")), phase: r.state,
    holder: r.holder, lag: r.lag, leftMs: null, dead: r.dead_letters || 0, failing: r.failing,
    stopped: null, held: null, warming: false, target: null, stateBytes: null, offset: r.offset,
  }));
  return owned.concat(tickets);
}

function fillFilter(id, values) {
  const select = $(id);
  const current = select.value;
  const have = [...select.options].map((o) => o.value).slice(1);
  if (have.join("\n") === values.join("\n")) return;
  select.replaceChildren(el("option", { value: "" }, "all"));
  for (const v of values) select.append(el("option", { value: v, selected: v === current }, v));
}

function sinceFetch() {
  return performance.now() - page.fetchedAt;
}

function render() {
  const { status, history, audit } = page.view;
  renderSummary(status);
  renderMembers(status, history);
  renderPartitions(status);
  renderTimeline(status, history);
  renderPlan(page.view.plan);
  renderList($("audit"), (audit || []).slice().reverse(), (a) => [el("time", {}, clockTime(a.at)), `${a.actor}: ${a.action}`]);
  $("updated").textContent = `read ${clockTime(status.now_ms)}`;
}

function renderSummary(s) {
  const q = s.quarantine || {};
  const rule = `quarantine ${duration(q.min_ms)}${q.wait_for_backup ? ` or until backed up (at most ${duration(q.max_ms)})` : ""}`;
  const coordinator = s.coordinator ? `${s.coordinator.member} (epoch ${s.coordinator.epoch})` : "none";
  const parts = [
    el("h2", {}, `Group ${s.group}`),
    el("div", {}, `coordinator ${coordinator} · ${rule} · version ${s.version}`),
  ];
  if (typeof s.load_imbalance === "number") {
    parts.push(el("div", { class: "muted" }, `load imbalance ${(s.load_imbalance * 100).toFixed(0)}%`));
  }
  $("summary").replaceChildren(...parts);
}

function spark(points, key) {
  const node = svg("svg", { class: "spark", viewBox: "0 0 120 22", preserveAspectRatio: "none" });
  if (points.length < 2) return node;
  const values = points.map((p) => p[key]);
  const top = Math.max(...values, 1e-9);
  const t0 = points[0].at_ms, t1 = points[points.length - 1].at_ms || t0 + 1;
  const xy = points.map((p) => `${(((p.at_ms - t0) / Math.max(1, t1 - t0)) * 118 + 1).toFixed(1)},${(21 - (p[key] / top) * 20).toFixed(1)}`);
  node.append(svg("polyline", { points: xy.join(" ") }));
  return node;
}

function renderMembers(s, history) {
  const body = $("members").tBodies[0];
  body.replaceChildren();
  const series = history.series || {};
  const rows = (s.members || []).map((m) => ({
    id: m.member, host: m.host, partitions: m.partitions, lease: m.lease_left_ms,
    heartbeat: m.last_heartbeat_ms_ago, live: m.live, draining: m.draining, load: m.load,
  }));
  for (const w of s.ticket_workers || []) {
    // Ticket workers: their claims in the partitions column.
    rows.push({ id: w.member, host: w.host, partitions: `${w.claims} claimed of ${w.slots ?? "?"} slots`, lease: null, heartbeat: null, live: true, load: null });
  }
  for (const m of rows) {
    const points = series[m.id] || [];
    const last = points[points.length - 1];
    body.append(el("tr", { "data-member": m.id, class: m.live ? null : "dead" },
      el("td", {}, m.id, m.draining ? " (draining)" : ""),
      el("td", {}, m.host || ""),
      el("td", {}, m.partitions),
      el("td", { "data-lease-ms": m.lease }, m.lease === null ? "" : duration(m.lease)),
      el("td", {}, m.heartbeat === null ? "" : `${duration(m.heartbeat)} ago`),
      el("td", {}, m.load && m.load.records_per_s !== undefined ? `${Math.round(m.load.records_per_s)}/s` : ""),
      el("td", {}, spark(points, "records_per_s"), last ? ` ${Math.round(last.records_per_s)}/s` : ""),
      el("td", {}, page.view.log_given ? [spark(points, "lag"), last ? ` ${last.lag}` : ""] : "start with --log for lag"),
      page.actions && m.live && !m.draining && s.members.some((x) => x.member === m.id)
        ? el("td", {}, actionButton("drain", `/api/drain?member=${encodeURIComponent(m.id)}`, `Drain ${m.id}? Its partitions move to the others.`))
        : null,
    ));
  }
}

function renderPartitions(s) {
  const all = allPartitions(s);
  fillFilter("f-topic", [...new Set(all.map((p) => p.topic))].sort());
  fillFilter("f-member", [...new Set(all.map((p) => p.holder).filter(Boolean))].sort());
  fillFilter("f-phase", [...new Set(all.map((p) => p.phase))].sort());
  const f = { topic: $("f-topic").value, member: $("f-member").value, phase: $("f-phase").value };
  const shown = all.filter((p) => (!f.topic || p.topic === f.topic) && (!f.member || p.holder === f.member) && (!f.phase || p.phase === f.phase));
  const counts = {};
  for (const p of all) counts[p.phase] = (counts[p.phase] || 0) + 1;
  $("counts").textContent = Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(" · ");
  $("shown").textContent = shown.length === all.length ? `${all.length} shown` : `${shown.length} of ${all.length} shown`;
  $("legend").replaceChildren(...Object.keys(counts).sort().map((k) => el("span", { class: `phase-${k.replace(" ", "-")}` }, k)));
  const cells = $("cells");
  cells.classList.toggle("compact", shown.length > COMPACT_OVER);
  cells.replaceChildren(...shown.map(cell));
  const problems = all.filter((p) => p.failing || p.stopped);
  $("problems").replaceChildren(...problems.map((p) => el("div", { class: "error", "data-problem": p.id },
    p.stopped ? `${p.id} failed: ${p.stopped.reason} (shardcall reset-offsets --to earliest, or restore an older backup)`
      : `${p.id} failing: ${p.failing.error || p.failing.last_error || JSON.stringify(p.failing)}`)));
}

function cell(p) {
  const title = [`${p.id}: ${p.phase}`, p.holder && `holder ${p.holder}`, p.lag !== null && p.lag !== undefined && `lag ${p.lag}`,
    p.dead && `${p.dead} dead letters`, p.stateBytes && `state ${bytes(p.stateBytes)}`, p.target && `moving to ${p.target}`,
    p.warming && "restoring its state", p.held && p.held.parents && `waits for ${p.held.parents.join(", ")}`].filter(Boolean).join(", ");
  const classes = ["cell", `phase-${p.phase.replace(" ", "-")}`, p.failing ? "failing" : "", p.warming ? "warming" : ""].join(" ");
  const left = p.phase === "quarantined" && p.leftMs !== null && p.leftMs !== undefined ? p.leftMs : null;
  return el("div", {
    class: classes, title, "data-partition": p.id, "data-phase": p.phase, "data-holder": p.holder || "",
    "data-left-ms": left, style: p.holder && (p.phase === "owned" || p.phase === "claimed") ? `--c: ${colour(p.holder)}` : null,
  },
  el("div", { class: "p" }, p.id),
  el("div", { class: "h" }, p.phase === "owned" || p.phase === "claimed" ? p.holder : p.phase === "quarantined" ? `after ${p.holder || "?"}` : p.phase),
  left !== null ? el("div", {}, el("span", { class: "countdown", "data-left-ms": left }, duration(left))) : null,
  el("div", { class: "l" }, p.lag !== null && p.lag !== undefined ? `lag ${p.lag}` : "", p.dead ? el("span", { class: "dl" }, ` ${p.dead} dead`) : ""),
  page.actions && left !== null
    ? actionButton("release", `/api/release?partition=${encodeURIComponent(p.id)}`, `End ${p.id}'s quarantine now?`)
    : null,
  );
}

// A button for an operator action (only when the server allows them); the
// answer is shown where errors are, and the next read shows the effect.
function actionButton(label, path, question) {
  const b = el("button", { type: "button", class: "action" }, label);
  b.addEventListener("click", async () => {
    if (!confirm(question)) return;
    try {
      const r = await fetch(`${path}&group=${encodeURIComponent(page.group)}`, {
        method: "POST", headers: { "x-shardcall-action": "1" },
      });
      const body = await r.json();
      if (!r.ok) throw new Error(body.error || `the server answered ${r.status}`);
      $("notice").textContent = body.done;
    } catch (e) {
      showError(e.message);
    }
    poll();
  });
  return b;
}

function renderTimeline(s, history) {
  const now = s.now_ms;
  // As far back as the server has watched, up to TIMELINE_MS (a minute at
  // least), so a page opened a moment ago is not a sliver at the edge.
  const starts = Object.values(history.lanes || {}).map((segs) => segs[0]?.from_ms ?? now);
  const span = Math.min(TIMELINE_MS, Math.max(60000, now - Math.min(now, ...starts)));
  const from = now - span;
  const f = { topic: $("f-topic").value, member: $("f-member").value };
  const lanes = Object.entries(history.lanes || {})
    .filter(([id, segs]) => (!f.topic || id.startsWith(`${f.topic}/`)) && (!f.member || segs.some((x) => x.holder === f.member)))
    .slice(0, MAX_LANES);
  const lane = 14, left = 70, width = 1000;
  const node = svg("svg", { viewBox: `0 0 ${width} ${lanes.length * lane + 16}`, preserveAspectRatio: "none" });
  const x = (t) => left + ((Math.max(t, from) - from) / span) * (width - left - 4);
  lanes.forEach(([id, segs], i) => {
    const y = i * lane + 2;
    const label = svg("text", { x: 2, y: y + 10 });
    label.textContent = id;
    node.append(label);
    segs.forEach((seg, j) => {
      // A segment lasts until the next one begins (or now).
      const end = j + 1 < segs.length ? segs[j + 1].from_ms : now;
      if (end < from) return;
      const fill = seg.phase === "owned" || seg.phase === "claimed" ? colour(seg.holder)
        : seg.phase === "quarantined" ? "#f6d28b" : seg.phase === "failed" ? "#f4a3a3" : "#e2e4e9";
      const r = svg("rect", { x: x(seg.from_ms), y, width: Math.max(1, x(end) - x(seg.from_ms)), height: lane - 3, fill, "data-phase": seg.phase });
      const t = svg("title", {});
      t.textContent = `${id}: ${seg.phase}${seg.holder ? ` (${seg.holder})` : ""} for ${duration(end - seg.from_ms)}`;
      r.append(t);
      node.append(r);
    });
  });
  const axis = svg("text", { x: left, y: lanes.length * lane + 13 });
  axis.textContent = `${duration(span)} ago → now; yellow: quarantine, coloured: each member's ownership`;
  node.append(axis);
  $("timeline").replaceChildren(node);
  renderList($("events"), (history.events || []).slice().reverse(), (e) => [el("time", {}, clockTime(e.at_ms)), e.text]);
}

function renderPlan(plan) {
  const lines = (plan && plan.explained) || [];
  if (!lines.length) {
    $("plan").replaceChildren(el("li", { class: "muted" }, "nothing to do: the group is balanced and no quarantine ends now"));
    return;
  }
  renderList($("plan"), lines, (line) => [line]);
}

function renderList(list, items, parts) {
  list.replaceChildren(...items.slice(0, 200).map((item) => el("li", {}, ...parts(item))));
}

// Between reads, quarantines count down by the time since the answer.
function tick() {
  if (!page.view) return;
  const gone = sinceFetch();
  for (const c of document.querySelectorAll(".countdown[data-left-ms]")) {
    c.textContent = duration(Math.max(0, Number(c.dataset.leftMs) - gone));
  }
}

$("group").addEventListener("change", (e) => {
  page.group = e.target.value;
  const url = new URL(location.href);
  url.searchParams.set("group", page.group);
  history.replaceState(null, "", url);
  poll();
});
for (const id of ["f-topic", "f-member", "f-phase"]) $(id).addEventListener("change", () => page.view && render());

loadGroups().then(poll);
setInterval(poll, 1000);
setInterval(tick, 200);
