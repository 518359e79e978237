// Recent requests: the gateway's audit records (every call to /v1 with a recognised key), newest
// first, as a table. API: GET /api/requests/recent?limit=N (requests.recent). Prompts and outputs
// are never recorded, so there is nothing more to show than what the table has, and two things
// next to it: refused credentials (counted since the server started, on /api, /mcp and /v1: they
// are not records, so a flood cannot push real ones out) and records that failed validation
// (`corrupt`: left out of the table, listed with their problem, never hidden).
//
// Auto-refresh (on by default) reloads every 3 s while the tab is visible. Records never change once
// written, so rows are kept by audit id and only new ones are built: the table updates in place,
// without a jump, and text selected in an old row stays selected.
import { api } from "../api.js";
import { empty, errorSlot, every, field, formatTime, h, humanError, pageHeader, placeholder, showError } from "../ui.js";

const LIMITS = [50, 200, 1000];
const REFRESH_MS = 3000;
const COLUMNS = [
  ["Time"], ["Method"], ["Path"], ["Status"], ["Latency (ms)", "num"], ["Model"], ["Key ID"], ["Stream"], ["Request ID"],
];

export async function render(root, page) {
  const auto = h("input", { type: "checkbox", name: "auto_refresh", checked: true });
  auto.id = "requests-auto-refresh";
  const limit = h("select", { name: "limit" }, LIMITS.map((n) => h("option", { value: String(n) }, String(n))));
  const refreshButton = h("button.button", { type: "button" }, "Refresh");
  const summary = h("p.muted.requests-summary", { "aria-live": "off" }, "\u00a0");
  const failures = h("p.muted.requests-failures", { "aria-live": "off" });
  const slot = errorSlot();

  const controls = h("div.requests-controls",
    h("div.check", auto, h("label", { for: auto.id }, "Auto-refresh")),
    field("Show", limit),
    refreshButton);

  const tbody = h("tbody");
  const table = h("div.table-wrap.requests-table", { hidden: true },
    h("table", { "aria-label": "Recent requests, newest first" },
      h("thead", h("tr", COLUMNS.map(([label, cls]) => h(cls ? `th.${cls}` : "th", { scope: "col" }, label)))),
      tbody));
  const corrupt = h("div.card.requests-corrupt", { hidden: true });
  const none = empty("No requests yet: calls to /v1 with an inference key appear here",
    h("a.button", { href: "/keys" }, "Create an inference key"));
  none.hidden = true;
  const loading = placeholder(6);
  const body = h("div.requests-body", corrupt, loading, table, none);

  root.append(
    pageHeader("Requests",
      "Every call to the inference gateway (/v1) with a recognised key, newest first: status, latency, "
      + "model and the key used. Prompts and outputs are never recorded; refused credentials are counted."),
    h("div.card.requests-toolbar", controls, summary, failures, slot),
    body);

  const rows = new Map(); // audit_id → <tr>, reused across refreshes
  let latest = 0; // a later call's answer always wins over an earlier, slower one
  let busy = false;

  const refresh = async () => {
    const ticket = ++latest;
    busy = true;
    try {
      const data = await api("GET", "/requests/recent", undefined,
        { query: { limit: limit.value }, signal: page.signal });
      if (ticket !== latest) return;
      showError(slot, null);
      show(data.requests);
      showFailures(failures, data.auth_failures);
      showCorrupt(corrupt, data.corrupt || []);
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401 || ticket !== latest) return;
      showError(slot, `Could not load the requests: ${humanError(error)}`);
      loading.remove(); // a failed first load leaves the error, not a pulsing placeholder
    } finally {
      if (ticket === latest) busy = false;
    }
  };

  const show = (records) => {
    loading.remove();
    const seen = new Set();
    const ordered = records.map((record) => {
      seen.add(record.audit_id);
      let tr = rows.get(record.audit_id);
      if (!tr) {
        tr = row(record);
        rows.set(record.audit_id, tr);
      }
      return tr;
    });
    for (const id of [...rows.keys()]) if (!seen.has(id)) rows.delete(id);
    // Move only what changed: the common case is a few new rows on top of the same list, and
    // rows left where they are keep any text selected in them.
    ordered.forEach((tr, i) => {
      const here = tbody.children[i];
      if (here !== tr) tbody.insertBefore(tr, here || null);
    });
    while (tbody.children.length > ordered.length) tbody.lastElementChild.remove();
    table.hidden = records.length === 0;
    none.hidden = records.length !== 0;
    const count = records.length === 1 ? "1 request" : `${records.length} requests`;
    const time = new Date().toLocaleTimeString();
    summary.textContent = `${count} shown, newest first. Updated ${time}${auto.checked ? ", refreshing every 3 s" : ""}.`;
  };

  auto.addEventListener("change", () => {
    if (auto.checked) refresh();
    else summary.textContent = summary.textContent.replace(/, refreshing every 3 s\.$/, ".");
  });
  limit.addEventListener("change", refresh);
  refreshButton.addEventListener("click", refresh);

  await refresh();
  every(REFRESH_MS, () => {
    if (auto.checked && !busy) refresh();
  }, page);
}

// Refused credentials since the server started: a count, never records (see the top of this file).
function showFailures(node, counts) {
  if (!counts) {
    node.textContent = "";
    return;
  }
  if (!counts.total) {
    node.textContent = "No refused credentials since the server started.";
    return;
  }
  const parts = [["API", counts.by_surface.api], ["MCP", counts.by_surface.mcp], ["gateway", counts.by_surface.gateway]]
    .filter(([, n]) => n)
    .map(([label, n]) => `${label} ${n}`);
  const last = counts.last_at ? `, the last at ${formatTime(counts.last_at)}` : "";
  node.textContent = `Refused credentials since the server started: ${counts.total} (${parts.join(", ")})${last}. `
    + "They are counted, not recorded.";
}

// Records that failed validation: left out of the table, but shown with their problem.
function showCorrupt(node, rows) {
  node.hidden = rows.length === 0;
  if (!rows.length) return;
  const title = rows.length === 1 ? "1 record could not be read" : `${rows.length} records could not be read`;
  node.replaceChildren(
    h("p.error-text", { role: "status" }, `${title} and ${rows.length === 1 ? "is" : "are"} not shown:`),
    h("ul.requests-corrupt-list", rows.map((c) => h("li",
      h("code", c.audit_id || `row ${c.rowid}`), c.audit_id ? ` (row ${c.rowid})` : "", `: ${c.problem}`))));
}

function row(r) {
  return h("tr", { dataset: { requestId: r.request_id, auditId: r.audit_id, status: String(r.status) } },
    h("td.nowrap", h("time", { datetime: r.created_at, title: formatTime(r.created_at) }, shortTime(r.created_at))),
    h("td", r.method),
    h("td.requests-path", h("code", r.path)),
    h("td", statusText(r.status)),
    h("td.num", formatLatency(r.duration_ms)),
    h("td.requests-model", r.model ? h("code", r.model) : h("span.muted", "—")),
    h("td", r.key_id ? h("code", r.key_id) : h("span.muted", { title: "Refused before a key was recognised" }, "none")),
    h("td", r.stream ? "yes" : "no"),
    h("td", h("code", r.request_id)));
}

// The number is the text; the colour (by class) only helps. 499 means the client went away.
function statusText(status) {
  const cls = `${Math.floor(status / 100)}xx`;
  const title = status === 499 ? "The client went away before the answer" : null;
  return h(`span.http-status.http-${cls}`, { title }, String(status));
}

const LATENCY = new Intl.NumberFormat(undefined, { minimumFractionDigits: 1, maximumFractionDigits: 1 });

function formatLatency(ms) {
  return Number.isFinite(ms) ? LATENCY.format(ms) : "—";
}

// Today's records show the time only (the date is in the tooltip); older ones the date too.
function shortTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return formatTime(iso);
  return date.toDateString() === new Date().toDateString() ? date.toLocaleTimeString() : formatTime(iso);
}
