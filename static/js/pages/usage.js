// Usage: requests and tokens per UTC day as two charts (js/charts.js, uPlot), the totals, and the
// keys that used the most tokens (docs/observability.md, "The Usage page").
//
// API: GET /api/usage (usage.summary) with `since`/`until` (UTC days: the last 7, 30 or 90 ending
// today) and the filters `key_id` and `deployment` ("" is a request that named no deployment). The
// filters' choices come from the same range asked without filters (its `keys` and `deployments`),
// so a choice never lists what the range does not hold; the filters are kept in the address
// (/usage?days=7&key_id=…), so a view can be linked or reloaded.
import { api } from "../api.js";
import { compactNumber, dayChart, dayToSeconds } from "../charts.js";
import { empty, errorSlot, field, h, pageHeader, placeholder, showError, utcRange } from "../ui.js";

const RANGES = [7, 30, 90];
const DEFAULT_DAYS = 30;
const NO_DEPLOYMENT = "\u0000none"; // the select's value for deployment "": a name can hold no NUL

function keyLabel(key) {
  return key.key_name === null || key.key_name === undefined ? `deleted key ${key.key_id}` : key.key_name;
}

function deploymentLabel(name) {
  return name === "" ? "(no deployment)" : name;
}

export async function render(root, page) {
  const wanted = new URLSearchParams(location.search);
  const days = RANGES.includes(Number(wanted.get("days"))) ? Number(wanted.get("days")) : DEFAULT_DAYS;
  const range = h("select", { name: "days" },
    RANGES.map((n) => h("option", { value: String(n), selected: n === days ? true : undefined }, `Last ${n} days`)));
  range.value = String(days);
  const keySelect = h("select", { name: "key_id" }, h("option", { value: "" }, "All keys"));
  const deploymentSelect = h("select", { name: "deployment" }, h("option", { value: "" }, "All deployments"));
  const filters = h("form.usage-filters", { "aria-label": "Filters", novalidate: true },
    field("Range", range), field("Key", keySelect), field("Deployment", deploymentSelect));
  filters.addEventListener("submit", (event) => event.preventDefault());

  const slot = errorSlot();
  const body = h("div.usage-body", placeholder(8));
  root.append(pageHeader("Usage", "Requests and tokens per day (UTC), by key and by deployment: what each client used."),
    filters, slot, body);

  let charts = [];
  const dropCharts = () => {
    for (const chart of charts) chart.destroy();
    charts = [];
  };
  page.cleanup.push(dropCharts);

  // A select's choices: "all" first, then `items` [[value, label]…], the current choice kept even
  // when the range no longer holds it (it then shows zeros, which is what it used).
  const fill = (select, items, chosen) => {
    const labels = new Map(items);
    if (chosen && !labels.has(chosen)) labels.set(chosen, chosen === NO_DEPLOYMENT ? deploymentLabel("") : chosen);
    const first = select.options[0];
    select.replaceChildren(first, ...[...labels].map(([value, label]) => h("option", { value }, label)));
    select.value = chosen || "";
  };
  fill(keySelect, [], wanted.get("key_id") || "");
  const wantedDeployment = wanted.has("deployment") ? wanted.get("deployment") || NO_DEPLOYMENT : "";
  fill(deploymentSelect, [], wantedDeployment);

  let generation = 0;
  const load = async () => {
    const mine = (generation += 1);
    const n = Number(range.value);
    const span = utcRange(n);
    const keyId = keySelect.value || undefined;
    const deployment = deploymentSelect.value === NO_DEPLOYMENT ? "" : deploymentSelect.value || undefined;
    const address = new URLSearchParams({ days: String(n) });
    if (keyId) address.set("key_id", keyId);
    if (deployment !== undefined) address.set("deployment", deployment);
    history.replaceState(history.state, "", `/usage?${address}`);
    const get = (query) => api("GET", "/usage", undefined, { query, signal: page.signal });
    let all;
    let shown;
    try {
      const filtered = keyId !== undefined || deployment !== undefined;
      [all, shown] = await Promise.all([get(span), filtered ? get({ ...span, key_id: keyId, deployment }) : null]);
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401 || mine !== generation) return;
      dropCharts();
      body.replaceChildren();
      showError(slot, `Could not load the usage: ${error.message}`);
      return;
    }
    if (mine !== generation) return; // a later choice is on its way
    showError(slot, null);
    fill(keySelect, all.keys.map((k) => [k.key_id, keyLabel(k)]), keySelect.value);
    fill(deploymentSelect, all.deployments.map((d) => [d.deployment === "" ? NO_DEPLOYMENT : d.deployment,
      deploymentLabel(d.deployment)]), deploymentSelect.value);
    show(shown || all, keyId !== undefined || deployment !== undefined);
  };

  const show = (usage, filtered) => {
    dropCharts();
    const t = usage.totals;
    const totals = h("div.stats.usage-totals",
      stat("Requests", t.requests), stat("Prompt tokens", t.prompt_tokens), stat("Completion tokens", t.completion_tokens));
    if (!t.requests) {
      body.replaceChildren(totals, empty(filtered
        ? `No requests match these filters from ${usage.since} to ${usage.until}.`
        : `No requests recorded from ${usage.since} to ${usage.until}. Each request a client sends to /v1 with a key `
          + "is counted here, with its tokens.",
      h("a.button", { href: "/#connect" }, "Connect a client"), h("a.button.quiet", { href: "/requests" }, "Requests")));
      return;
    }
    const x = usage.days.map((d) => dayToSeconds(d.day));
    const requestsBox = h("div.usage-chart", { dataset: { chart: "requests" } });
    const tokensBox = h("div.usage-chart", { dataset: { chart: "tokens" } });
    body.replaceChildren(totals,
      h("div.usage-charts",
        h("section.card.usage-chart-card", { "aria-labelledby": "usage-requests" },
          h("h2#usage-requests", "Requests per day"), requestsBox),
        h("section.card.usage-chart-card", { "aria-labelledby": "usage-tokens" },
          h("h2#usage-tokens", "Tokens per day"), tokensBox)),
      topKeys(usage.keys));
    charts = [
      dayChart(requestsBox, {
        series: [{ label: "Requests", colour: "--chart-1", kind: "bars" }],
        data: [x, usage.days.map((d) => d.requests)],
      }),
      dayChart(tokensBox, {
        series: [{ label: "Prompt", colour: "--chart-2", kind: "line" }, { label: "Completion", colour: "--chart-3", kind: "line" }],
        data: [x, usage.days.map((d) => d.prompt_tokens), usage.days.map((d) => d.completion_tokens)],
      }),
    ];
  };

  for (const select of [range, keySelect, deploymentSelect]) select.addEventListener("change", load);
  await load();
}

function stat(label, value) {
  return h("div.stat", h("span.stat-value", { title: value.toLocaleString() }, compactNumber(value)), h("span.stat-label", label));
}

// The keys, most tokens first (the server's order), with what each used in the range.
function topKeys(keys) {
  return h("section.card.usage-keys", { "aria-labelledby": "usage-keys" },
    h("h2#usage-keys", "Top keys"),
    h("div.table-wrap", h("table.usage-keys-table",
      h("thead", h("tr", ["Key", "Requests", "Prompt tokens", "Completion tokens"]
        .map((c, i) => h(i ? "th.num" : "th", { scope: "col" }, c)))),
      h("tbody", keys.map((k) => h("tr", { dataset: { keyId: k.key_id } },
        h("td.usage-key", { title: `id ${k.key_id}` }, keyLabel(k)),
        h("td.num", k.requests.toLocaleString()),
        h("td.num", k.prompt_tokens.toLocaleString()),
        h("td.num", k.completion_tokens.toLocaleString())))))));
}
