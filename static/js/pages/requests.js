// Recent requests: the gateway's audit records (every call to /v1 with a recognised key), newest
// first, as a table. API: GET /api/requests/recent (requests.recent) with `limit` and the filters
// `key_id`, `model` (a part of it), `status` (404 or 4xx), `since`/`until` (ISO 8601), applied by
// the server; the filters are also in the page's address (/requests?status=4xx), so a filtered
// view can be linked. Prompts and outputs are never recorded, so there is nothing more to show
// than what the table has, and two things next to it: refused credentials (counted since the
// server started, on /api, /mcp and /v1: they are not records, so a flood cannot push real ones
// out) and records that failed validation (`corrupt`: left out of the table, listed with their
// problem, never hidden).
//
// The key column shows the key's name (a deleted key: "deleted key" and its id). The table has
// fixed column widths and cuts long values with an ellipsis (the whole value in the cell's title),
// so it never scrolls sideways at desktop widths; under 720 px it becomes cards like every table
// (docs/console.md, "Tables on narrow screens").
//
// Auto-refresh (on by default) reloads every 3 s while the tab is visible. Records never change once
// written, so rows are kept by audit id and only new ones are built: the table updates in place,
// without a jump, and text selected in an old row stays selected.
import { api } from "../api.js";
import {
  empty, errorSlot, every, field, formatTime, h, humanError, pageHeader, placeholder, showError, showFieldErrors,
} from "../ui.js";

const LIMITS = [50, 200, 1000];
const REFRESH_MS = 3000;
const COLUMNS = [
  ["Time", "requests-time"], ["Key", "requests-key"], ["Model", "requests-model"], ["Request", "requests-path"],
  ["Status", "requests-status"], ["Latency (ms)", "requests-latency num"], ["Tokens", "requests-tokens num"],
  ["Request ID", "requests-id"],
];

export async function render(root, page) {
  const auto = h("input", { type: "checkbox", name: "auto_refresh", checked: true });
  auto.id = "requests-auto-refresh";
  const limit = h("select", { name: "limit" }, LIMITS.map((n) => h("option", { value: String(n) }, String(n))));
  const refreshButton = h("button.button", { type: "button" }, "Refresh");
  const summary = h("p.muted.requests-summary", { "aria-live": "off" }, "\u00a0");
  const failures = h("p.muted.requests-failures", { "aria-live": "off" });
  const slot = errorSlot();

  // --- filters: read by the server; kept in the address -------------------------------------
  const keySelect = h("select", { name: "key_id" }, h("option", { value: "" }, "Any key"));
  const models = h("datalist", { id: "requests-models" });
  const modelInput = h("input", { type: "search", name: "model", list: models.id, placeholder: "any", autocomplete: "off" });
  const statuses = h("datalist", { id: "requests-statuses" },
    [["2xx", "succeeded"], ["4xx", "refused or invalid"], ["5xx", "failed"], ["499", "client went away"]]
      .map(([value, label]) => h("option", { value }, label)));
  const statusInput = h("input", { type: "search", name: "status", list: statuses.id, placeholder: "e.g. 4xx, 404",
    autocomplete: "off" });
  const sinceInput = h("input", { type: "datetime-local", name: "since" });
  const untilInput = h("input", { type: "datetime-local", name: "until" });
  const clearButton = h("button.button.quiet", { type: "button" }, "Clear filters");
  const filterForm = h("form.requests-filters", { "aria-label": "Filters", novalidate: true },
    field("Key", keySelect), field("Model contains", modelInput), models, field("Status", statusInput), statuses,
    h("div.requests-range", field("From", sinceInput), field("To", untilInput)),
    h("div.actions", h("button.button", { type: "submit" }, "Apply"), clearButton));

  const controls = h("div.requests-controls",
    h("div.check", auto, h("label", { for: auto.id }, "Auto-refresh")),
    field("Show", limit),
    refreshButton);

  const tbody = h("tbody");
  const table = h("div.table-wrap.requests-table", { hidden: true },
    h("table", { "aria-label": "Recent requests, newest first" },
      h("colgroup", COLUMNS.map(([, cls]) => h(`col.${cls.split(" ")[0]}`))),
      h("thead", h("tr", COLUMNS.map(([label, cls]) => h(`th.${cls.replace(" ", ".")}`, { scope: "col" }, label)))),
      tbody));
  const corrupt = h("div.card.requests-corrupt", { hidden: true });
  const none = empty("No requests yet: calls to /v1 with an inference key appear here",
    h("a.button", { href: "/keys" }, "Create an inference key"));
  none.hidden = true;
  const noMatch = empty("No request matches these filters.",
    h("button.button", { type: "button", onclick: () => clearFilters() }, "Clear filters"));
  noMatch.hidden = true;
  const loading = placeholder(6);
  const body = h("div.requests-body", corrupt, loading, table, none, noMatch);

  root.append(
    pageHeader("Requests",
      "Every call to the inference gateway (/v1) with a recognised key, newest first: status, latency, "
      + "model and the key used. Prompts and outputs are never recorded; refused credentials are counted."),
    h("div.card.requests-toolbar", filterForm, controls, summary, failures, slot),
    body);

  // The key filter's choices: the keys (names) from api_keys.list, and any key seen in the records
  // that is not there (a deleted one). A reader that may not list keys gets the seen ones only.
  const keyNames = new Map(); // id → {name, deleted}
  const fillKeys = () => {
    const chosen = keySelect.value;
    const counts = new Map();
    for (const { name } of keyNames.values()) if (name) counts.set(name, (counts.get(name) || 0) + 1);
    const sorted = [...keyNames.entries()].sort(([a, x], [b, y]) =>
      (x.name || "\uffff").localeCompare(y.name || "\uffff") || a.localeCompare(b));
    keySelect.replaceChildren(h("option", { value: "" }, "Any key"), ...sorted.map(([id, k]) =>
      h("option", { value: id }, k.name ? (counts.get(k.name) > 1 ? `${k.name} (id ${id.slice(0, 6)}…)` : k.name)
        : k.deleted ? `deleted key (id ${id})` : `key ${id}`)));
    if (chosen && !keyNames.has(chosen)) keySelect.append(h("option", { value: chosen }, `key ${chosen}`));
    keySelect.value = chosen;
  };
  const learnKeys = (records) => {
    let changed = false;
    for (const r of records) {
      if (!r.key_id) continue;
      const known = keyNames.get(r.key_id);
      if (!known || known.name !== r.key_name || known.deleted !== r.key_deleted) {
        keyNames.set(r.key_id, { name: r.key_name, deleted: r.key_deleted });
        changed = true;
      }
    }
    if (changed) fillKeys();
  };
  const seenModels = new Set();
  const learnModels = (records) => {
    for (const r of records) {
      if (r.model && !seenModels.has(r.model) && seenModels.size < 200) {
        seenModels.add(r.model);
        models.append(h("option", { value: r.model }));
      }
    }
  };

  // The address ↔ the form. Times travel as ISO 8601 (UTC); the inputs show local time.
  const readAddress = () => {
    const query = new URLSearchParams(location.search);
    keySelect.value = "";
    const keyId = query.get("key_id");
    if (keyId) {
      if (!keyNames.has(keyId)) keyNames.set(keyId, { name: null, deleted: false });
      fillKeys();
      keySelect.value = keyId;
    }
    modelInput.value = query.get("model") || "";
    statusInput.value = query.get("status") || "";
    sinceInput.value = toLocalInput(query.get("since"));
    untilInput.value = toLocalInput(query.get("until"));
  };
  const filters = () => ({
    key_id: keySelect.value || null,
    model: modelInput.value || null,
    status: statusInput.value.trim() || null,
    since: fromLocalInput(sinceInput.value),
    until: fromLocalInput(untilInput.value, 59_999), // "to 10:05" includes the whole minute
  });
  const filtered = () => Object.values(filters()).some((v) => v !== null);
  const writeAddress = () => {
    const query = new URLSearchParams();
    for (const [k, v] of Object.entries(filters())) if (v !== null) query.set(k, v);
    const wanted = location.pathname + (query.toString() ? `?${query}` : "");
    if (location.pathname + location.search !== wanted) history.replaceState(history.state, "", wanted);
  };

  const rows = new Map(); // audit_id → <tr>, reused across refreshes
  let latest = 0; // a later call's answer always wins over an earlier, slower one
  let busy = false;

  const refresh = async () => {
    const ticket = ++latest;
    busy = true;
    try {
      const data = await api("GET", "/requests/recent", undefined,
        { query: { limit: limit.value, ...filters() }, signal: page.signal });
      if (ticket !== latest) return;
      showError(slot, null);
      showFieldErrors(filterForm, null);
      learnKeys(data.requests);
      learnModels(data.requests);
      show(data.requests);
      showFailures(failures, data.auth_failures);
      showCorrupt(corrupt, data.corrupt || []);
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401 || ticket !== latest) return;
      // A filter the server refused is named under its field; anything else goes in the slot.
      if (!showFieldErrors(filterForm, error)) showError(slot, `Could not load the requests: ${humanError(error)}`);
      else showError(slot, null);
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
      if (!tr || tr.dataset.keyName !== (record.key_name || "")) {
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
    none.hidden = records.length !== 0 || filtered();
    noMatch.hidden = records.length !== 0 || !filtered();
    const count = records.length === 1 ? "1 request" : `${records.length} requests`;
    const time = new Date().toLocaleTimeString();
    summary.textContent = `${count}${filtered() ? " matching the filters" : ""} shown, newest first. `
      + `Updated ${time}${auto.checked ? ", refreshing every 3 s" : ""}.`;
  };

  const applyFilters = () => {
    writeAddress();
    refresh();
  };
  const clearFilters = () => {
    filterForm.reset();
    keySelect.value = "";
    applyFilters();
  };

  filterForm.addEventListener("submit", (event) => {
    event.preventDefault();
    applyFilters();
  });
  // Choices apply at once; typed text when it is committed (Enter or leaving the field).
  for (const input of [keySelect, modelInput, statusInput, sinceInput, untilInput]) {
    input.addEventListener("change", applyFilters);
  }
  clearButton.addEventListener("click", clearFilters);
  auto.addEventListener("change", () => {
    if (auto.checked) refresh();
    else summary.textContent = summary.textContent.replace(/, refreshing every 3 s\.$/, ".");
  });
  limit.addEventListener("change", refresh);
  refreshButton.addEventListener("click", refresh);

  readAddress();
  api("GET", "/keys", undefined, { signal: page.signal }).then((data) => {
    for (const key of data.keys || []) {
      if (key.id && key.id !== "<malformed>") keyNames.set(key.id, { name: key.name || null, deleted: false });
    }
    fillKeys();
  }).catch(() => { /* no keys.list for this reader: the keys seen in the records are offered */ });
  await refresh();
  every(REFRESH_MS, () => {
    if (auto.checked && !busy) refresh();
  }, page);
}

// An ISO time → the value of a datetime-local input (local time, to the minute); "" if none or bad.
function toLocalInput(iso) {
  const date = iso ? new Date(iso) : null;
  if (!date || Number.isNaN(date.getTime())) return "";
  const local = new Date(date.getTime() - date.getTimezoneOffset() * 60_000);
  return local.toISOString().slice(0, 16);
}

// A datetime-local value (local time) → ISO 8601 in UTC, plus `extraMs`; null when empty.
function fromLocalInput(value, extraMs = 0) {
  if (!value) return null;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? null : new Date(date.getTime() + extraMs).toISOString();
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

// One record. Cells with long values cut them with an ellipsis; the whole value is in the title.
function row(r) {
  const request = `${r.method} ${r.path}`;
  return h("tr", { dataset: { requestId: r.request_id, auditId: r.audit_id, status: String(r.status),
    keyId: r.key_id || "", keyName: r.key_name || "" } },
    h("td.requests-time", h("time", { datetime: r.created_at, title: formatTime(r.created_at) }, shortTime(r.created_at))),
    keyCell(r),
    h("td.requests-model", r.model ? { title: r.model } : {}, r.model ? h("code", r.model) : h("span.muted", "—")),
    h("td.requests-path", { title: r.stream ? `${request} (streamed)` : request },
      h("span.requests-method", r.method), " ", h("code", r.path), r.stream ? h("span.requests-stream", " · stream") : null),
    h("td.requests-status", statusText(r.status)),
    h("td.requests-latency.num", formatLatency(r.duration_ms)),
    tokensCell(r),
    h("td.requests-id", { title: r.request_id }, h("code", r.request_id)));
}

// The key by its name; a deleted key says so, with its id; no key (an old record) says that.
function keyCell(r) {
  if (!r.key_id) {
    return h("td.requests-key", h("span.muted", { title: "Recorded before a key was recognised" }, "no key"));
  }
  if (r.key_name) return h("td.requests-key", { title: `${r.key_name} (id ${r.key_id})` }, r.key_name);
  const what = r.key_deleted ? "deleted key" : "key";
  return h("td.requests-key", { title: `${what} (id ${r.key_id})` },
    h("span.muted", what), " ", h("code", r.key_id));
}

// The number is the text; the colour (by class) only helps. 499 means the client went away.
function statusText(status) {
  const cls = `${Math.floor(status / 100)}xx`;
  const title = status === 499 ? "The client went away before the answer" : null;
  return h(`span.http-status.http-${cls}`, { title }, String(status));
}

const LATENCY = new Intl.NumberFormat(undefined, { minimumFractionDigits: 1, maximumFractionDigits: 1 });

// Prompt + completion tokens, as the upstream reported them; "—" when not known (docs/observability.md).
function tokensCell(r) {
  if (r.prompt_tokens == null && r.completion_tokens == null) {
    return h("td.requests-tokens.num", { title: "Not known" }, h("span.muted", "—"));
  }
  const [prompt, completion] = [r.prompt_tokens, r.completion_tokens].map((n) => (n == null ? "?" : String(n)));
  return h("td.requests-tokens.num", { title: `${prompt} prompt + ${completion} completion tokens` },
    `${prompt} + ${completion}`);
}

function formatLatency(ms) {
  return Number.isFinite(ms) ? LATENCY.format(ms) : "—";
}

// Today's records show the time only, older ones the day too (the year if not this one); the
// full date and time is in the tooltip.
function shortTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return formatTime(iso);
  const now = new Date();
  if (date.toDateString() === now.toDateString()) return date.toLocaleTimeString();
  const sameYear = date.getFullYear() === now.getFullYear();
  return date.toLocaleString(undefined, sameYear
    ? { month: "short", day: "numeric", hour: "numeric", minute: "2-digit" }
    : { year: "2-digit", month: "numeric", day: "numeric", hour: "numeric", minute: "2-digit" });
}
