// batchstream console: one script, no build, no dependency. Every page is a view over the public
// API (docs/api.md) called with the key the user entered; the API decides what the key may see.
"use strict";

const KEY_STORAGE = "batchstream.console.key";
const POLL_MS = 1000;

const state = { key: localStorage.getItem(KEY_STORAGE) || "", config: null, view: 0, timers: [], flash: "" };

// ------------------------------------------------------------------ helpers

class ApiError extends Error {
  constructor(status, message, error) {
    super(message);
    this.status = status;
    this.error = error || {};
  }
}

async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${state.key}`, ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    logout("The API key was refused. Enter a valid key.");
    throw new ApiError(401, "unauthorized");
  }
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    const err = body && body.error ? body.error : {};
    throw new ApiError(response.status, err.message || `${response.status} ${response.statusText}`, err);
  }
  return options.raw ? response : response.json();
}

// h("a", {href: "#"}, "text", child...): elements built from data, never from HTML strings.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name === "style") el.style.cssText = value; // CSSOM: allowed by the pages' CSP
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const main = () => document.getElementById("main");
const fmtInt = (n) => (n ?? 0).toLocaleString("en-US");
const terminal = (status) => state.config.terminal.includes(status);

function fmtTime(unix) {
  if (!unix) return "—";
  const d = new Date(unix * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// The rates behind a batch's estimated end: its expected output tokens per second when the
// estimate counts work, and its lines per second when known.
function rateText(batch) {
  const rates = [];
  if (batch.estimated_rate_tokens_per_s) rates.push(`${fmtInt(Math.round(batch.estimated_rate_tokens_per_s))} tokens/s`);
  if (batch.estimated_rate_lines_per_s) rates.push(`${batch.estimated_rate_lines_per_s} lines/s`);
  return rates.join(", ") || "—";
}

function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "—";
  seconds = Math.max(0, Math.round(seconds));
  const hours = Math.floor(seconds / 3600), minutes = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  if (hours) return `${hours}h ${minutes}m`;
  if (minutes) return `${minutes}m ${s}s`;
  return `${s}s`;
}

function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KB", "MB", "GB"];
  let value = n / 1024, i = 0;
  while (value >= 1024 && i < units.length - 1) { value /= 1024; i += 1; }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[i]}`;
}

// Seconds left: the batch's own estimate (estimated_completion_at: docs/api.md, "Estimated
// completion") when it has one, else at its rate since it started; null when there is nothing to go on.
function timeLeft(batch) {
  const c = batch.request_counts, done = c.completed + c.failed;
  if (terminal(batch.status) || !batch.in_progress_at || !c.total) return null;
  if (done >= c.total) return 0;
  if (batch.estimated_completion_at) return Math.max(0, batch.estimated_completion_at - Date.now() / 1000);
  const elapsed = Date.now() / 1000 - batch.in_progress_at;
  if (done === 0 || elapsed <= 0) return null;
  return (c.total - done) / (done / elapsed);
}

function progressBar(counts, big = false) {
  const total = counts.total || 0;
  const pct = (n) => (total ? (100 * n) / total : 0);
  return h(
    "div",
    {
      class: big ? "bar big" : "bar", role: "progressbar", "aria-label": "Lines done",
      "aria-valuemin": 0, "aria-valuemax": total, "aria-valuenow": counts.completed + counts.failed,
      "data-completed": counts.completed, "data-failed": counts.failed, "data-total": total,
    },
    h("span", { class: "done", style: `width:${pct(counts.completed)}%` }),
    h("span", { class: "fail", style: `width:${pct(counts.failed)}%` }),
  );
}

function countsText(counts) {
  return h("span", { class: "counts" },
    `${fmtInt(counts.completed)} done · ${fmtInt(counts.failed)} failed · ${fmtInt(counts.total)} total`);
}

const badge = (status) => h("span", { class: `badge ${status}` }, status.replace("_", " "));

function notice(text, ok = false) {
  return h("p", { class: ok ? "notice ok" : "notice", role: ok ? "status" : "alert" }, text);
}

function confirmDialog(text, confirmLabel) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-yes").textContent = confirmLabel;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
  });
}

// Downloads go through fetch (the key is a header, not a cookie) and a blob link; a failure is
// shown at the top of the page.
async function download(fileId, fallbackName) {
  try { await fetchDownload(fileId, fallbackName); }
  catch (err) { if (err.status !== 401) main().prepend(notice(`Download failed: ${err.message}`)); }
}

async function fetchDownload(fileId, fallbackName) {
  const meta = await api(`/v1/files/${encodeURIComponent(fileId)}`);
  const response = await api(`/v1/files/${encodeURIComponent(fileId)}/content`, { raw: true });
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: meta.filename || fallbackName });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// A page's repeated refresh (the first run at once when ``now``); one run at a time, stopped when
// the view changes.
function every(ms, fn, view, now = false) {
  let busy = false;
  const tick = async () => {
    if (busy || view !== state.view) return;
    busy = true;
    try { await fn(); } catch (err) { if (err.status !== 401) console.warn(err); } finally { busy = false; }
  };
  state.timers.push(setInterval(tick, ms));
  if (now) tick();
}

function setPage(title, ...content) {
  document.title = `${title} · batchstream console`;
  main().replaceChildren(...content);
}

// ------------------------------------------------------------------ login

function logout(message) {
  state.key = "";
  state.flash = message || "";
  localStorage.removeItem(KEY_STORAGE);
  go("#/login");
}

// Show ``hash``: through hashchange when it changes, at once when it is already the address.
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function loginPage() {
  const message = state.flash;
  state.flash = "";
  const input = h("input", { type: "password", id: "key", name: "key", autocomplete: "off", required: true });
  const error = h("div", { "aria-live": "polite" }, message ? notice(message) : null);
  const form = h("form", {
    onsubmit: async (event) => {
      event.preventDefault();
      state.key = input.value.trim();
      try {
        await fetchModelsOrThrow();
        localStorage.setItem(KEY_STORAGE, state.key);
        go(location.hash && !location.hash.startsWith("#/login") ? location.hash : "#/batches");
      } catch (err) {
        state.key = "";
        error.replaceChildren(notice(err.status === 401 ? "Incorrect API key." : err.message));
      }
    },
  },
    h("label", { for: "key" }, "API key"), input,
    h("button", { type: "submit", class: "primary" }, "Log in"),
  );
  setPage("Log in", h("section", { class: "login" },
    h("h1", {}, "Log in"),
    h("p", { class: "muted" }, "The console shows the batches and files of your key's project. The key stays in this browser."),
    error, form));
  input.focus();
}

async function fetchModelsOrThrow() {
  const response = await fetch("/v1/models", { headers: { Authorization: `Bearer ${state.key}` } });
  if (!response.ok) throw new ApiError(response.status, (await response.json()).error?.message || "refused");
}

// ------------------------------------------------------------------ batches

async function listBatches(status, size, after) {
  const batches = [];
  let cursor = after, hasMore = true;
  while (batches.length < size && hasMore) {
    const params = new URLSearchParams({ limit: String(Math.min(state.config.pages.batches_max, size - batches.length)) });
    if (cursor) params.set("after", cursor);
    if (status) params.set("status", status);
    const page = await api(`/v1/batches?${params}`);
    batches.push(...page.data);
    hasMore = page.has_more;
    cursor = page.last_id;
  }
  return { batches, hasMore };
}

function batchRow(batch) {
  const left = timeLeft(batch);
  const meta = Object.entries(batch.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  return h("tr", { "data-id": batch.id, "data-status": batch.status },
    h("td", { class: "id" }, h("a", { href: `#/batches/${batch.id}` }, batch.id),
      // Anthropic Messages lines: a message batch (/v1/messages/batches) or a batch of them.
      batch.endpoint === "/v1/messages" ? [" ", h("span", { class: "badge", title: "Anthropic Messages requests" }, "messages")] : null),
    h("td", {}, badge(batch.status)),
    h("td", {}, progressBar(batch.request_counts), countsText(batch.request_counts)),
    h("td", { class: "wide" }, fmtTime(batch.created_at)),
    h("td", { class: "wide" }, fmtTime(batch.in_progress_at)),
    h("td", {}, left === null ? "—" : fmtDuration(left)),
    h("td", { class: "num wide" }, batch.priority ?? 0),
    h("td", { class: "wide" }, meta || "—"),
  );
}

function batchesPage(query, view) {
  const status = query.get("status") || "";
  const size = Number(query.get("size") || state.config.pages.batches_default);
  const cursors = (query.get("cursors") || "").split(",").filter(Boolean); // the pages before
  const after = cursors.length ? cursors[cursors.length - 1] : null;
  const go = (changes) => {
    const next = new URLSearchParams({ status, size: String(size), cursors: cursors.join(","), ...changes });
    for (const [k, v] of [...next]) if (!v) next.delete(k);
    location.hash = `#/batches?${next}`;
  };
  const statusSelect = h("select", { id: "status-filter", onchange: (e) => go({ status: e.target.value, cursors: "" }) },
    h("option", { value: "" }, "All statuses"),
    state.config.statuses.map((s) => h("option", { value: s, selected: s === status }, s.replace("_", " "))));
  const sizeSelect = h("select", { id: "page-size", onchange: (e) => go({ size: e.target.value, cursors: "" }) },
    state.config.pages.batches_sizes.map((n) => h("option", { value: n, selected: n === size }, n)));
  const tbody = h("tbody", {});
  const summary = h("p", { class: "muted", "aria-live": "polite" }, "Loading…");
  const prev = h("button", { type: "button", disabled: !cursors.length, onclick: () => go({ cursors: cursors.slice(0, -1).join(",") }) }, "← Newer");
  const next = h("button", { type: "button", disabled: true }, "Older →");
  let lastId = null;
  next.addEventListener("click", () => lastId && go({ cursors: [...cursors, lastId].join(",") }));

  setPage("Batches",
    h("h1", {}, "Batches"),
    h("div", { class: "toolbar" },
      h("label", {}, "Status", statusSelect),
      h("label", {}, "Per page", sizeSelect),
      h("a", { class: "button", href: "#/new" }, "New batch")),
    summary,
    h("div", { class: "scroll" }, h("table", { id: "batches" },
      h("thead", {}, h("tr", {},
        h("th", {}, "Batch"), h("th", {}, "Status"), h("th", {}, "Progress"),
        h("th", { class: "wide" }, "Created"), h("th", { class: "wide" }, "Started"), h("th", {}, "Time left"),
        h("th", { class: "num wide" }, "Priority"), h("th", { class: "wide" }, "Metadata"))),
      tbody)),
    h("div", { class: "pager" }, prev, next));

  // The page's batches by id, in list order. The first load reads the whole page; a refresh
  // reads only what can change: the newest batches (on the first page) and the open ones.
  let shown = new Map(), hasMore = false;
  const openStatuses = state.config.statuses.filter((s) => !terminal(s));

  const reload = async () => {
    const page = await listBatches(status, size, after);
    shown = new Map(page.batches.map((b) => [b.id, b]));
    hasMore = page.hasMore;
  };

  const update = async () => {
    const open = [...shown.values()].filter((b) => !terminal(b.status)).map((b) => b.id);
    const fresh = [];
    if (!after) {
      const params = new URLSearchParams({ limit: String(Math.min(state.config.pages.batches_max, size)) });
      if (status) params.set("status", status);
      const head = (await api(`/v1/batches?${params}`)).data;
      const added = head.filter((b) => !shown.has(b.id));
      if (added.length && added.length === head.length && shown.size) return reload(); // too many new ones
      fresh.push(...head);
      if (added.length) {
        // The newest page in its own order, then the older rows already shown.
        const inHead = new Set(head.map((b) => b.id));
        shown = new Map([...head.map((b) => [b.id, b]), ...[...shown].filter(([id]) => !inHead.has(id))]);
        if (shown.size > size) { shown = new Map([...shown].slice(0, size)); hasMore = true; }
      }
    }
    const wanted = new Set(open.filter((id) => !fresh.some((b) => b.id === id)));
    if (wanted.size && wanted.size <= 20) {
      const got = await Promise.all([...wanted].map((id) => api(`/v1/batches/${id}`).catch(() => null)));
      fresh.push(...got.filter(Boolean));
    } else if (wanted.size) {
      // Many open: list the open statuses (newest first) until each is found.
      let cursor = null;
      for (let pages = 0; wanted.size && pages <= Math.ceil(size / state.config.pages.batches_max); pages += 1) {
        const params = new URLSearchParams({ limit: String(state.config.pages.batches_max), status: openStatuses.join(",") });
        if (cursor) params.set("after", cursor);
        const page = await api(`/v1/batches?${params}`);
        for (const b of page.data) if (wanted.delete(b.id)) fresh.push(b);
        if (!page.has_more) break;
        cursor = page.last_id;
      }
      // Still missing: ended meanwhile (no longer open); read each.
      const got = await Promise.all([...wanted].map((id) => api(`/v1/batches/${id}`).catch(() => null)));
      fresh.push(...got.filter(Boolean));
    }
    for (const b of fresh) if (shown.has(b.id)) shown.set(b.id, b);
    // Under a status filter, a batch that moved on leaves the list (as a reload would show it).
    if (status) for (const [id, b] of shown) if (!status.split(",").includes(b.status)) shown.delete(id);
  };

  let loaded = false;
  const refresh = async () => {
    const started = performance.now();
    if (loaded) await update(); else { await reload(); loaded = true; }
    if (view !== state.view) return;
    // A row is rebuilt only when what it shows changed, so focus and scroll stay where they were.
    const old = new Map([...tbody.rows].map((row) => [row.dataset.id, row]));
    const batches = [...shown.values()];
    const rows = batches.map((b) => {
      const signature = JSON.stringify(b) + fmtDuration(timeLeft(b));
      const existing = old.get(b.id);
      if (existing && existing.dataset.signature === signature) return existing;
      const row = batchRow(b);
      row.dataset.signature = signature;
      if (existing && existing.contains(document.activeElement)) {
        existing.replaceChildren(...row.childNodes);
        existing.dataset.status = b.status;
        existing.dataset.signature = signature;
        return existing;
      }
      return row;
    });
    if (rows.length !== tbody.rows.length || rows.some((r, i) => tbody.rows[i] !== r)) tbody.replaceChildren(...rows);
    summary.textContent = batches.length
      ? `${fmtInt(batches.length)} batch${batches.length === 1 ? "" : "es"}${hasMore ? " on this page; older ones on the next" : ""}.`
      : "No batches" + (status ? ` with status ${status.replace("_", " ")}.` : " yet.");
    lastId = batches.length ? batches[batches.length - 1].id : null;
    next.disabled = !hasMore;
    // Read by the console benchmark (bench/console.py): fetch, compare and redraw, per refresh.
    performance.measure("batches-refresh", { start: started });
  };
  every(POLL_MS, async () => {
    try { await refresh(); } catch (err) { if (!loaded) summary.replaceChildren(notice(err.message)); throw err; }
  }, view, true);
}

// The plot: completed and failed lines over time, an inline SVG.
function progressPlot(progress, batch) {
  // Drawn at the page's width (no letterboxing, text at its real size).
  const W = Math.max(320, Math.round(main().clientWidth) - 40), H = 200, L = 48, R = 12, T = 10, B = 26;
  const svg = (tag, attrs, ...kids) => {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    for (const kid of kids) el.append(kid);
    return el;
  };
  const samples = progress.data.map((s) => [s.at, s.completed, s.failed]);
  const start = batch.in_progress_at || batch.created_at;
  const c = batch.request_counts;
  const end = batch.completed_at || batch.cancelled_at || batch.expired_at || batch.failed_at || Date.now() / 1000;
  const kept = samples.filter((s) => s[0] >= start);
  const last = Math.max(end, start + 1, ...kept.map((s) => s[0])); // counts are flushed after the fact
  const points = [[start, 0, 0], ...kept, [last, c.completed, c.failed]];
  const t0 = start, t1 = last;
  const top = Math.max(c.total, 1);
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (n) => T + (1 - n / top) * (H - T - B);
  const line = (i) => points.map((p) => `${x(p[0]).toFixed(1)},${y(p[i]).toFixed(1)}`).join(" ");
  const title = svg("title", {});
  title.textContent = `Lines done over time: ${c.completed} completed, ${c.failed} failed of ${c.total}`;
  const label = (text, attrs) => { const t = svg("text", attrs); t.textContent = text; return t; };
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "plot", role: "img", id: "plot" },
    title,
    svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), class: "axis" }),
    svg("line", { x1: L, y1: T, x2: L, y2: y(0), class: "axis" }),
    label(fmtInt(c.total), { x: L - 6, y: T + 10, "text-anchor": "end" }),
    label("0", { x: L - 6, y: y(0), "text-anchor": "end" }),
    label(fmtTime(t0).slice(11), { x: L, y: H - 6 }),
    label(fmtDuration(t1 - t0), { x: W - R, y: H - 6, "text-anchor": "end" }),
    svg("polyline", { points: line(1), class: "completed" }),
    svg("polyline", { points: line(2), class: "failed" }),
  );
}

function timeline(batch) {
  const steps = [
    ["created", batch.created_at], ["in progress", batch.in_progress_at], ["finalizing", batch.finalizing_at],
    ["cancelling", batch.cancelling_at], ["completed", batch.completed_at], ["failed", batch.failed_at],
    ["expired", batch.expired_at], ["cancelled", batch.cancelled_at],
  ].filter(([, t]) => t).sort((a, b) => a[1] - b[1]);
  return h("ol", { id: "timeline" }, steps.map(([name, t]) => h("li", {}, `${name}: ${fmtTime(t)}`)));
}

function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

function errorLinesSection(batchId, view) {
  const rows = h("tbody", {});
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const more = h("button", { type: "button", hidden: true }, "Show more");
  const customId = h("input", { type: "search", name: "custom_id", id: "search-custom-id", placeholder: "contains…" });
  const code = h("input", { type: "search", name: "code", id: "search-code", placeholder: "e.g. batch_cancelled or 400" });
  let offset = 0, shown = 0, asked = 0;
  const table = h("div", { class: "scroll", hidden: true }, h("table", {},
    h("thead", {}, h("tr", {}, h("th", { class: "num wide" }, "#"), h("th", {}, "custom_id"),
      h("th", {}, "Code"), h("th", { class: "num wide" }, "HTTP"), h("th", {}, "Message"))), rows));

  const load = async (reset) => {
    const ask = ++asked; // a newer request makes this one's answer stale
    const from = reset ? 0 : offset;
    const params = new URLSearchParams({ offset: String(from), limit: String(state.config.pages.error_lines) });
    if (customId.value.trim()) params.set("custom_id", customId.value.trim());
    if (code.value.trim()) params.set("code", code.value.trim());
    let page;
    try {
      page = await api(`/v1/batches/${encodeURIComponent(batchId)}/error_lines?${params}`);
    } catch (err) {
      if (ask === asked && view === state.view) status.replaceChildren(notice(err.message));
      return;
    }
    if (ask !== asked || view !== state.view) return;
    if (reset) { offset = 0; shown = 0; rows.replaceChildren(); }
    for (const line of page.data) {
      rows.append(h("tr", { "data-custom-id": line.custom_id },
        h("td", { class: "num wide" }, line.line),
        h("td", { class: "id" }, line.custom_id),
        h("td", {}, h("code", {}, line.code)),
        h("td", { class: "num wide" }, line.status_code ?? "—"),
        h("td", {}, h("details", {}, h("summary", {}, line.message || "(no message)"),
          h("pre", { class: "raw" }, JSON.stringify(line.raw, null, 2))))));
    }
    shown += page.data.length;
    offset = page.next_offset ?? offset + page.data.length;
    more.hidden = !page.has_more;
    table.hidden = shown === 0;
    status.textContent = shown ? `${fmtInt(shown)} error line${shown === 1 ? "" : "s"} shown${page.has_more ? "; more below" : ""}.` : "No error lines" + (customId.value || code.value ? " match." : ".");
  };
  more.addEventListener("click", () => load(false));
  const form = h("form", { class: "toolbar", role: "search", onsubmit: (e) => { e.preventDefault(); load(true); } },
    h("label", { for: "search-custom-id" }, "custom_id", customId),
    h("label", { for: "search-code" }, "Error code", code),
    h("button", { type: "submit" }, "Search"));
  const section = h("section", { id: "error-lines" },
    h("h2", {}, "Error lines"), form, status,
    table, more);
  const untouched = () => offset <= 50 && !rows.querySelector("details[open]");
  return { section, load, untouched };
}

function batchPage(batchId, view) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  setPage(batchId, h("p", {}, h("a", { href: "#/batches" }, "← Batches")), body);
  const errors = errorLinesSection(batchId, view);
  // Parts that hold focusable controls are rebuilt only when they change (focus stays put).
  const heading = h("div", {}), actionsBox = h("div", {}), details = h("div", {});
  let failedSeen = -1, endedSeen = false, actionsKey = "", laidOut = false, errorsLoadedAt = 0;

  const render = async () => {
    const [batch, progress] = await Promise.all([
      api(`/v1/batches/${encodeURIComponent(batchId)}`),
      api(`/v1/batches/${encodeURIComponent(batchId)}/progress`),
    ]);
    if (view !== state.view) return;
    const c = batch.request_counts, u = batch.usage;
    const ended = terminal(batch.status);
    const actions = h("div", { class: "actions" },
      batch.output_file_id ? h("button", { type: "button", id: "download-output", onclick: () => download(batch.output_file_id, `${batch.id}_output.jsonl`) }, "Download output") : null,
      batch.error_file_id ? h("button", { type: "button", id: "download-errors", onclick: () => download(batch.error_file_id, `${batch.id}_errors.jsonl`) }, "Download errors") : null,
      h("button", { type: "button", onclick: () => download(batch.input_file_id, `${batch.id}_input.jsonl`) }, "Download input"),
      !ended && batch.status !== "cancelling" ? h("button", {
        type: "button", class: "danger", id: "cancel",
        onclick: async () => {
          if (!(await confirmDialog(`Cancel batch ${batch.id}? Lines not yet run will not run.`, "Cancel batch"))) return;
          try { await api(`/v1/batches/${batch.id}/cancel`, { method: "POST" }); await render(); }
          catch (err) { body.prepend(notice(err.message)); }
        },
      }, "Cancel batch") : null);
    const validation = batch.errors && batch.errors.data && batch.errors.data.length ? h("section", { id: "validation-errors" },
      h("h2", {}, `Validation errors (${batch.errors.data.length})`),
      h("div", { class: "scroll" }, h("table", {},
        h("thead", {}, h("tr", {}, h("th", { class: "num" }, "Line"), h("th", {}, "Code"), h("th", {}, "Message"), h("th", { class: "wide" }, "Param"))),
        h("tbody", {}, batch.errors.data.map((e) => h("tr", {},
          h("td", { class: "num" }, e.line ?? "—"), h("td", {}, h("code", {}, e.code)), h("td", {}, e.message), h("td", { class: "wide" }, e.param ?? "—"))))))) : null;
    const defaults = Object.keys(state.config.defaults).map((k) => [k, batch[k] ?? "—"]);
    if (!laidOut) {
      body.replaceChildren(heading, actionsBox, details, errors.section);
      laidOut = true;
    }
    heading.replaceChildren(h("h1", {}, batch.id, " ", badge(batch.status)));
    const key = [batch.status, batch.output_file_id, batch.error_file_id].join("|");
    if (key !== actionsKey) { actionsBox.replaceChildren(actions); actionsKey = key; }
    details.replaceChildren(...[
      progressBar(c, true),
      h("p", { id: "counts" }, countsText(c), ended ? "" : ` · time left ${fmtDuration(timeLeft(batch))}`,
        !ended && batch.estimated_completion_at ? h("span", { id: "estimated-end" },
          ` · ends about ${fmtTime(batch.estimated_completion_at)} at ${rateText(batch)}`) : ""),
      validation,
      h("div", { class: "grid" },
        h("section", { class: "card" }, h("h2", {}, "Status"), timeline(batch)),
        h("section", { class: "card" }, h("h2", {}, "Usage"), kv([
          ["Prompt tokens", fmtInt(u.input_tokens)], ["Cached tokens", fmtInt(u.input_tokens_details.cached_tokens)],
          ["Completion tokens", fmtInt(u.output_tokens)], ["Total tokens", fmtInt(u.total_tokens)]])),
        h("section", { class: "card" }, h("h2", {}, "Batch"), kv([
          ["Endpoint", batch.endpoint], ["Model", batch.model], ["Window", batch.completion_window],
          ["Priority", batch.priority], ["Prefix order", batch.prefix_order ? "yes" : "no"],
          ["Mixed models", batch.mixed_models ? "yes" : "no"],
          ["Expires", fmtTime(batch.expires_at)],
          ["Metadata", Object.entries(batch.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "—"]])),
        h("section", { class: "card" }, h("h2", {}, "Defaults"), kv(defaults)),
        batch.usage_by_model ? h("section", { class: "card", id: "usage-by-model" }, h("h2", {}, "Tokens by model"),
          kv(Object.entries(batch.usage_by_model).map(([model, mu]) => [model, fmtInt(mu.total_tokens)]))) : null),
      h("h2", {}, "Lines over time"),
      progressPlot(progress, batch)].filter(Boolean));
    // Error lines: at first, at the end, and while failures rise at most every 5 s, unless the
    // reader has paged further or opened a line (their view is not pulled from under them).
    const now = Date.now();
    const due = failedSeen < 0 || (ended && !endedSeen)
      || (c.failed !== failedSeen && now - errorsLoadedAt >= 5000 && errors.untouched());
    if (due) {
      failedSeen = c.failed;
      endedSeen = ended;
      errorsLoadedAt = now;
      errors.load(true); // not awaited: the page's refresh does not wait on the search
    }
    return ended;
  };
  render().then((ended) => {
    if (!ended) every(POLL_MS, async () => { if (await render()) stopTimers(); }, view);
  }).catch((err) => body.replaceChildren(notice(err.status === 404 ? `No batch ${batchId} in this project.` : err.message)));
}

// ------------------------------------------------------------------ new batch

function defaultsFields() {
  return Object.entries(state.config.defaults).map(([name, schema]) => {
    const typed = (schema.anyOf || [schema]).find((s) => s.type && s.type !== "null") || {};
    return h("label", {}, name,
      h("input", {
        type: "number", name, step: typed.type === "integer" ? "1" : "any",
        min: typed.minimum ?? typed.exclusiveMinimum, max: typed.maximum, title: schema.description || "",
      }));
  });
}

function newBatchPage(view) {
  const file = h("input", { type: "file", id: "file", name: "file", accept: ".jsonl,application/jsonl,text/plain" });
  const chosen = h("span", { class: "muted", id: "chosen" }, "No file chosen.");
  const drop = h("label", { class: "drop", for: "file", id: "drop" },
    h("strong", {}, "Drop a JSONL file here"), h("br"), "or choose one:", file, chosen);
  let picked = null;
  const pick = (f) => { picked = f; chosen.textContent = f ? `${f.name} (${fmtBytes(f.size)})` : "No file chosen."; };
  file.addEventListener("change", () => pick(file.files[0] || null));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) pick(e.dataTransfer.files[0]);
  });
  const { minimum, maximum } = state.config.priority;
  const result = h("div", { "aria-live": "polite", id: "create-result" });
  const submit = h("button", { type: "submit", class: "primary" }, "Upload and create");
  const form = h("form", {
    id: "new-batch",
    onsubmit: async (event) => {
      event.preventDefault();
      if (!picked) { result.replaceChildren(notice("Choose a JSONL file first.")); return; }
      const data = new FormData(form);
      const body = { endpoint: data.get("endpoint"), completion_window: data.get("completion_window") };
      if (data.get("priority") !== "") body.priority = Number(data.get("priority"));
      if (data.get("prefix_order") !== "") body.prefix_order = data.get("prefix_order") === "true";
      if (data.get("mixed_models")) body.mixed_models = true;
      for (const name of Object.keys(state.config.defaults)) {
        if (data.get(name) !== "" && data.get(name) !== null) body[name] = Number(data.get(name));
      }
      const metadata = {};
      for (const raw of String(data.get("metadata") || "").split("\n")) {
        if (!raw.trim()) continue;
        const at = raw.indexOf("=");
        if (at < 1) { result.replaceChildren(notice(`Metadata lines are key=value: ${raw}`)); return; }
        metadata[raw.slice(0, at).trim()] = raw.slice(at + 1).trim();
      }
      if (Object.keys(metadata).length) body.metadata = metadata;
      submit.disabled = true;
      try {
        result.replaceChildren(h("p", { class: "muted" }, `Uploading ${picked.name}…`));
        const upload = new FormData();
        upload.append("purpose", "batch");
        upload.append("file", picked, picked.name);
        const uploaded = await api("/v1/files", { method: "POST", body: upload });
        body.input_file_id = uploaded.id;
        result.replaceChildren(h("p", { class: "muted" }, "Creating the batch…"));
        const batch = await api("/v1/batches", {
          method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" },
        });
        location.hash = `#/batches/${batch.id}`;
      } catch (err) {
        if (view === state.view) result.replaceChildren(notice(err.error?.param ? `${err.message} (${err.error.param})` : err.message));
      } finally {
        submit.disabled = false;
      }
    },
  },
    drop,
    h("div", { class: "form" },
      h("label", {}, "Endpoint", h("select", { name: "endpoint", id: "endpoint" }, state.config.endpoints.map((e) => h("option", { value: e }, e)))),
      h("label", {}, "Completion window", h("select", { name: "completion_window" }, state.config.completion_windows.map((w) => h("option", { value: w }, w)))),
      h("label", {}, `Priority (${minimum} to ${maximum})`, h("input", { type: "number", name: "priority", min: minimum, max: maximum, step: 1, placeholder: "0" })),
      h("label", {}, "Prefix order", h("select", { name: "prefix_order" },
        h("option", { value: "" }, "default"), h("option", { value: "true" }, "on"), h("option", { value: "false" }, "off"))),
      h("label", { class: "check" }, h("input", { type: "checkbox", name: "mixed_models", id: "mixed-models", value: "true" }),
        " Lines may name several models and adapters"),
      h("label", {}, "Metadata (key=value per line)", h("textarea", { name: "metadata", rows: 2 })),
      h("fieldset", {}, h("legend", {}, "Defaults for lines that do not set them"), h("div", { class: "form" }, defaultsFields()))),
    submit, result);
  setPage("New batch", h("h1", {}, "New batch"),
    h("p", { class: "muted" }, "One request per line, as OpenAI's Batch API takes them. The lines are validated after the batch is created; errors are listed per line on its page."),
    form);
}

// ------------------------------------------------------------------ files, models, usage

function filesPage(query, view) {
  const cursors = (query.get("cursors") || "").split(",").filter(Boolean);
  const tbody = h("tbody", {});
  const summary = h("p", { class: "muted", "aria-live": "polite" }, "Loading…");
  const next = h("button", { type: "button", disabled: true }, "Older →");
  const prev = h("button", { type: "button", disabled: !cursors.length, onclick: () => { location.hash = `#/files?cursors=${cursors.slice(0, -1).join(",")}`; } }, "← Newer");
  setPage("Files", h("h1", {}, "Files"), summary,
    h("div", { class: "scroll" }, h("table", { id: "files" },
      h("thead", {}, h("tr", {}, h("th", {}, "File"), h("th", {}, "Name"), h("th", { class: "wide" }, "Purpose"),
        h("th", { class: "num" }, "Size"), h("th", { class: "wide" }, "Created"), h("th", { class: "wide" }, "Expires"), h("th", {}, ""))),
      tbody)),
    h("div", { class: "pager" }, prev, next));
  const load = async () => {
    const params = new URLSearchParams({ limit: String(state.config.pages.files) });
    if (cursors.length) params.set("after", cursors[cursors.length - 1]);
    const page = await api(`/v1/files?${params}`);
    if (view !== state.view) return;
    tbody.replaceChildren(...page.data.map((f) => h("tr", { "data-id": f.id },
      h("td", { class: "id" }, f.id), h("td", {}, f.filename), h("td", { class: "wide" }, f.purpose),
      h("td", { class: "num" }, fmtBytes(f.bytes)), h("td", { class: "wide" }, fmtTime(f.created_at)),
      h("td", { class: "wide" }, fmtTime(f.expires_at)),
      h("td", {}, h("div", { class: "actions" },
        h("button", { type: "button", onclick: () => download(f.id, f.filename) }, "Download"),
        h("button", {
          type: "button", class: "danger",
          onclick: async () => {
            if (!(await confirmDialog(`Delete ${f.filename} (${f.id})? This cannot be undone.`, "Delete file"))) return;
            try { await api(`/v1/files/${f.id}`, { method: "DELETE" }); await load(); }
            catch (err) { summary.replaceChildren(notice(err.message)); }
          },
        }, "Delete"))))));
    summary.textContent = page.data.length ? `${page.data.length} file${page.data.length === 1 ? "" : "s"}.` : "No files.";
    next.disabled = !page.has_more;
    next.onclick = () => { location.hash = `#/files?cursors=${[...cursors, page.last_id].join(",")}`; };
  };
  load().catch((err) => summary.replaceChildren(notice(err.message)));
}

function modelsPage(view) {
  const tbody = h("tbody", {});
  const summary = h("p", { class: "muted" }, "Loading…");
  setPage("Models", h("h1", {}, "Models"), summary,
    h("div", { class: "scroll" }, h("table", { id: "models" },
      h("thead", {}, h("tr", {}, h("th", {}, "Model"), h("th", {}, "Workers"), h("th", { class: "num" }, "Your running batches"),
        h("th", { class: "num" }, "Your queued lines"), h("th", { class: "num wide" }, "Context length"))),
      tbody)));
  const load = async () => {
    const page = await api("/v1/models?include=status");
    if (view !== state.view) return;
    const now = Date.now() / 1000;
    const open = new Set([...tbody.querySelectorAll("details[open]")].map((d) => d.closest("tr").dataset.id));
    tbody.replaceChildren(...page.data.map((m) => {
      const alive = m.workers.filter((w) => w.alive).length;
      return h("tr", { "data-id": m.id },
        h("td", { class: "id" }, m.id),
        h("td", {}, h("details", { open: open.has(m.id) }, h("summary", {}, `${alive} alive of ${m.workers.length}`),
          h("ul", {}, m.workers.map((w) => h("li", {}, h("span", { class: w.alive ? "dot alive" : "dot", "aria-hidden": "true" }),
            `${w.id}: ${w.alive ? "alive" : "silent"}, seen ${fmtDuration(now - w.last_seen)} ago`))))),
        h("td", { class: "num" }, fmtInt(m.running_batches)),
        h("td", { class: "num" }, fmtInt(m.queued_lines)),
        h("td", { class: "num wide" }, m.max_context_length ? fmtInt(m.max_context_length) : "—"));
    }));
    summary.textContent = page.data.length ? `${page.data.length} model${page.data.length === 1 ? "" : "s"} announced by workers.` : "No worker has announced a model yet.";
  };
  every(2 * POLL_MS, async () => {
    try { await load(); } catch (err) { summary.replaceChildren(notice(err.message)); throw err; }
  }, view, true);
}

function usagePage(query, view) {
  const days = Number(query.get("days") || 30);
  const tbody = h("tbody", {}), tfoot = h("tfoot", {});
  const summary = h("p", { class: "muted" }, "Loading…");
  const select = h("select", { id: "usage-days", onchange: (e) => { location.hash = `#/usage?days=${e.target.value}`; } },
    [7, 30, 90, 365].map((n) => h("option", { value: n, selected: n === days }, `last ${n} days`)));
  setPage("Usage", h("h1", {}, "Usage"), limitsPanel(view),
    h("h2", {}, "Lines and tokens"),
    h("div", { class: "toolbar" }, h("label", {}, "Period", select)), summary,
    h("div", { class: "scroll" }, h("table", { id: "usage" },
      h("thead", {}, h("tr", {}, ["Day (UTC)", "Model"].map((t) => h("th", {}, t)),
        ["Batches", "Lines done", "Failed", "Prompt tokens", "Cached", "Completion tokens", "Total tokens"].map((t) => h("th", { class: "num" }, t)))),
      tbody, tfoot)));
  api(`/v1/usage?days=${days}`).then((page) => {
    if (view !== state.view) return;
    const cells = (r) => [r.batches, r.completed, r.failed, r.input_tokens, r.cached_tokens, r.output_tokens, r.total_tokens]
      .map((n) => h("td", { class: "num" }, fmtInt(n)));
    tbody.replaceChildren(...page.data.map((r) => h("tr", {}, h("td", {}, r.day), h("td", { class: "id" }, r.model || "—"), cells(r))));
    const sum = (k) => page.data.reduce((acc, r) => acc + r[k], 0);
    const total = Object.fromEntries(["batches", "completed", "failed", "input_tokens", "cached_tokens", "output_tokens", "total_tokens"].map((k) => [k, sum(k)]));
    tfoot.replaceChildren(h("tr", {}, h("th", {}, "All"), h("th", {}, ""), cells(total)));
    summary.textContent = page.data.length ? `Batches created in the last ${days} days, per model and day.` : `No batches in the last ${days} days.`;
  }).catch((err) => summary.replaceChildren(notice(err.message)));
}

// The project's quotas and its use of each (GET /v1/limits); a limit of null is unlimited.
function limitsPanel(view) {
  const note = h("p", { class: "muted" }, "Loading…");
  const tbody = h("tbody", {});
  const panel = h("section", { class: "card", id: "limits" }, h("h2", {}, "Limits"), note,
    h("div", { class: "scroll" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Quota"), h("th", {}, "Model"), h("th", { class: "num" }, "Used"), h("th", { class: "num" }, "Limit"))),
      tbody)));
  const row = (name, model, quota, fmt = fmtInt) => h("tr", { "data-quota": name },
    h("td", {}, name), h("td", { class: "id" }, model || "—"),
    h("td", { class: "num" }, fmt(quota.used)), h("td", { class: "num" }, quota.limit === null ? "unlimited" : fmt(quota.limit)));
  api("/v1/limits").then((limits) => {
    if (view !== state.view) return;
    tbody.replaceChildren(
      row("stored bytes", null, limits.stored_bytes, fmtBytes),
      row("batches in progress", null, limits.batches_in_progress),
      row("concurrent validations", null, limits.concurrent_validations),
      ...limits.models.flatMap((m) => [row("queued lines", m.model, m.queued_lines), row("enqueued tokens (estimated)", m.model, m.enqueued_tokens)]));
    note.textContent = `Project ${limits.project}: a request past a limit answers 429; a batch past a model's limit fails.`;
  }).catch((err) => note.replaceChildren(notice(err.message)));
  return panel;
}

// ------------------------------------------------------------------ routing

function safeDecode(text) {
  try { return decodeURIComponent(text); } catch (_) { return text; }
}

function stopTimers() {
  for (const timer of state.timers) clearInterval(timer);
  state.timers = [];
}

function route() {
  stopTimers();
  state.view += 1;
  const view = state.view;
  const [path, rawQuery] = (location.hash.replace(/^#/, "") || "/batches").split("?");
  const query = new URLSearchParams(rawQuery || "");
  const parts = path.split("/").filter(Boolean);
  const loggedIn = Boolean(state.key);
  document.getElementById("nav").hidden = !loggedIn;
  document.getElementById("logout").hidden = !loggedIn;
  document.getElementById("who").textContent = loggedIn ? `key …${state.key.slice(-4)}` : "";
  const section = parts[0] || "batches";
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!loggedIn || section === "login") return loginPage();
  if (section === "batches" && parts[1]) return batchPage(safeDecode(parts[1]), view);
  if (section === "new") return newBatchPage(view);
  if (section === "files") return filesPage(query, view);
  if (section === "models") return modelsPage(view);
  if (section === "usage") return usagePage(query, view);
  return batchesPage(query, view);
}

async function start() {
  state.config = await (await fetch("/console/config.json")).json();
  document.getElementById("logout").addEventListener("click", () => logout());
  // The skip link moves focus, not the address (which names the page shown).
  document.querySelector(".skip").addEventListener("click", (event) => { event.preventDefault(); main().focus(); });
  window.addEventListener("hashchange", () => {
    route();
    if (!document.activeElement || document.activeElement === document.body) main().focus({ preventScroll: true });
  });
  route();
}

start();
