// Overview: the first-run checklist (until every step is done), "Connect a client" (js/connect.js),
// the runtime and the deployments' instances, record counts, the machine (CPUs, memory, disk), the
// system (tools) and the GPUs (docs/console.md, "Overview, Connect a client, sign-in").
//
// API: GET /api/dashboard (system with its machine facts, GPUs, counts, and `traffic`: the request
// rate over its last `window_s` seconds and the streams open now), GET /api/runtime (its
// `instances`: every deployment's), GET /api/models, GET /api/deployments and GET /api/keys (the
// checklist, the names clients use), refreshed every 5 s. Each card is replaced on a refresh except
// Connect a client, which keeps its choice and a secret just created.
//
// `/?model=<name>#connect` (the Deployments page's "Connect a client") chooses that model and
// scrolls to the card; the console's router drops the fragment on an in-app link, so `?model=` alone
// does the same.
import { api } from "../api.js";
import { addModelForm } from "../add-model.js";
import { connectPanel, modelNames } from "../connect.js";
import { deployLink } from "./model-actions.js";
import { runtimeWord, stateBadge } from "../states.js";
import { summarize } from "../status.js";
import { empty, every, formatBytes, formatDuration, h, humanError, pageHeader, placeholder, progressBar } from "../ui.js";

export async function render(root, page) {
  const wanted = new URLSearchParams(location.search).get("model");
  let refresh = async () => {};
  // A key made in the card completes the checklist's key step now, not at the next refresh.
  const connect = connectPanel({ page, preselect: wanted, onCreated: () => refresh() });
  const connectCard = h("section#connect.card.wide.connect-card", { "aria-labelledby": "ov-connect" },
    h("h2#ov-connect", { tabindex: "-1" }, "Connect a client"),
    h("p.purpose", "What a program or a colleague needs to use a model here: the address, a key and a model name."),
    connect.element);
  // The checklist's "Add a model" form: one element kept across refreshes (what is typed stays).
  const addForm = addModelForm({ signal: page.signal, card: false, onAdded: () => refresh() });
  const loading = h("div.overview-loading", placeholder(6));
  // The cards in order; each slot's element is replaced on refresh, the connect card stays.
  const slots = ["checklist", "connect", "runtime", "traffic", "counts", "machine", "system", "gpus"];
  const shown = Object.fromEntries(slots.map((s) => [s, s === "connect" ? connectCard : h("div", { hidden: true })]));
  const body = h("div.overview", slots.map((s) => shown[s]));
  const error = h("p.error-text", { role: "alert", hidden: true });
  root.append(pageHeader("Overview", "The machine, the vLLM runtime, what is registered, and how clients connect."),
    error, loading, body);
  body.hidden = true;
  const put = (slot, element) => {
    shown[slot].replaceWith(element);
    shown[slot] = element;
  };
  let first = true;
  refresh = async () => {
    try {
      const [dash, runtime, models, listed, keys] = await Promise.all([
        api("GET", "/dashboard", undefined, { signal: page.signal }),
        api("GET", "/runtime", undefined, { signal: page.signal }),
        api("GET", "/models", undefined, { signal: page.signal }),
        api("GET", "/deployments", undefined, { signal: page.signal }),
        api("GET", "/keys", undefined, { signal: page.signal }),
      ]);
      error.hidden = true;
      const deployments = listed.deployments;
      put("checklist", checklist({ models: models.models, deployments, keys: keys.keys, counts: dash.counts, addForm }));
      connect.setModels(modelNames(deployments, runtime));
      put("runtime", runtimeCard(runtime, models.models, deployments));
      put("traffic", trafficCard(dash.traffic));
      put("counts", countsCard(dash.counts, models.models));
      put("machine", machineCard(dash.system.machine));
      put("system", systemCard(dash.system));
      put("gpus", gpuSection(dash.gpus));
      loading.remove();
      body.hidden = false;
      if (first) {
        first = false;
        if (wanted || location.hash === "#connect") {
          connectCard.scrollIntoView({ block: "start" });
          connectCard.querySelector("h2").focus({ preventScroll: true });
        }
      }
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      error.hidden = false;
      error.textContent = `Could not load the overview: ${humanError(err)}`;
      loading.remove();
    }
  };
  await refresh();
  every(5000, refresh, page);
}

// The first-run checklist: each step says what to do and links to where; gone once all are done.
// The model step holds the add form itself (the first thing a new operator does, in place); once a
// model is downloaded the deployment step's link is that model's "Deploy".
function checklist({ models, deployments, keys, counts, addForm }) {
  const downloaded = models.filter((m) => m.status === "ready");
  const downloading = models.some((m) => m.status === "downloading");
  // The chat's own key ("playground · …", docs/chat.md) is made by opening the chat: not a client's.
  const clientKey = keys.some((k) => k.enabled && k.scopes.includes("inference") && !k.name.startsWith("playground"));
  const steps = [
    { step: "token", done: true, title: "Sign in with the admin token", text: "Done: you are signed in." },
    {
      step: "model", done: downloaded.length > 0, title: "Add a model",
      text: downloading
        ? "A model is downloading; it can be deployed once it is downloaded."
        : "A Hugging Face repository (or a folder on this machine), in the form below: it is checked, then "
          + "downloaded at once.",
      link: downloading ? ["/downloads", "See the download"] : null,
      form: downloading ? null : addForm,
      also: downloading ? null : ["/models", "Models page"],
    },
    {
      step: "deployment", done: deployments.length > 0, title: "Deploy it",
      text: "A deployment is a name clients ask for; it loads the model on the first request, or when you load it.",
      link: downloaded.length ? deployLink(downloaded[0].id) : ["/deployments", "Deployments"],
    },
    {
      step: "key", done: clientKey, title: "Create a key for a client",
      text: "A key with the inference scope lets a program call /v1; Connect a client below creates one.",
      link: ["#connect", "Connect a client"], also: ["/keys", "API keys"],
    },
    {
      step: "request", done: counts.requests > 0, title: "Send a first request",
      text: "From the Chat page, or run a snippet from Connect a client.",
      link: ["/chat", "Chat"],
    },
  ];
  const left = steps.filter((s) => !s.done).length;
  if (!left) return h("div", { hidden: true, dataset: { checklist: "done" } });
  return h("section#first-run.card.wide.first-run-card", { "aria-labelledby": "ov-first-run" },
    h("h2#ov-first-run", "First steps"),
    h("p.purpose", `${steps.length - left} of ${steps.length} done. This list goes away once every step is done.`),
    h("ol.checklist", steps.map((s) => h("li", { dataset: { step: s.step, done: String(s.done) } },
      h("span.check-mark", { "aria-hidden": "true" }, s.done ? "✓" : ""),
      h("div",
        h("strong", s.title), " ", h("span.step-state", s.done ? "done" : "to do"),
        h("p", s.text),
        !s.done && (s.link || s.also) ? h("div.actions", s.link ? stepLink(s.link, s.step) : null,
          s.also ? h("a.button.small.quiet", { href: s.also[0] }, s.also[1]) : null) : null)))),
    // A step's form spans the card under the steps (a step's column is too narrow for it).
    steps.filter((s) => !s.done && s.form).map((s) => h("div.first-run-form", { dataset: { step: s.step } },
      h("h3", s.title), s.form)));
}

// A link to a page, or (for "#connect") a button that scrolls to the card: the console's router
// would take a fragment link for a new visit of this page.
function stepLink(link, step) {
  if (link instanceof Node) return link;
  const [href, label] = link;
  if (href !== "#connect") return h("a.button.small", { href, dataset: { action: step } }, label);
  return h("button.button.small", { type: "button", dataset: { action: step }, onclick: () => {
    const card = document.getElementById("connect");
    card.scrollIntoView({ block: "start", behavior: "smooth" });
    card.querySelector("h2").focus({ preventScroll: true });
  } }, label);
}

function runtimeCard(rt, models, deployments) {
  // A registered model by its name; a model started by path or Hub id as it was given.
  const registered = models.find((m) => m.id === rt.active_model_id);
  // Deployments first: that is how models run; the runtime's own state is the one model run alone
  // (the Runtime page), so "stopped" there says nothing against a deployment serving.
  const rows = [["Deployments", (rt.instances || []).length ? summarize(rt.instances.map((i) => i.state)) : "none yet"],
    ["One model alone", stateBadge(runtimeWord(rt.state))]];
  if (rt.state !== "stopped") rows.push(["Model", registered ? registered.name : rt.model || "—"]);
  if (rt.pid) rows.push(["PID", String(rt.pid)]);
  if (rt.uptime_s !== null && rt.uptime_s !== undefined) rows.push(["Up for", formatDuration(rt.uptime_s)]);
  rows.push(["Clients use", h("code", `${location.origin}/v1`)]);
  // vLLM's own port skips keys and audit: shown only as what it is, never as the address to use.
  if (rt.upstream) {
    rows.push(["vLLM itself", h("span.internal-address", h("code", rt.upstream),
      h("span.internal-note", " internal: skips keys and audit — don't give it out"))]);
  }
  if (rt.error) rows.push(["Last error", rt.error]);
  // The runtime page runs one model alone; models otherwise run as deployments.
  const action = rt.state !== "stopped" && !rt.deployment
    ? h("a.button", { href: "/runtime" }, "Open runtime")
    : deployments.length ? h("a.button", { href: "/deployments" }, "Open deployments") : null;
  return h("section.card", { "aria-labelledby": "ov-runtime" },
    h("h2#ov-runtime", "Runtime"),
    definitionList(rows),
    action ? h("div.actions", action) : null);
}

// The gateway's load now: requests per second over the last minute and the streams open, refreshed
// with the page; "—" while the server does not say (an older server).
function trafficCard(traffic) {
  const known = traffic && Number.isFinite(traffic.requests_per_s);
  const rate = known ? traffic.requests_per_s.toFixed(traffic.requests_per_s >= 10 ? 0 : 2) : "—";
  const streams = traffic && Number.isFinite(traffic.active_streams) ? String(traffic.active_streams) : "—";
  return h("section.card.traffic-card", { "aria-labelledby": "ov-traffic" },
    h("h2#ov-traffic", "Traffic"),
    h("div.stats",
      h("div.stat", { dataset: { stat: "rate" } }, h("span.stat-value", `${rate} req/s`),
        h("span.stat-label", "Request rate"),
        h("span.stat-note", known ? `over the last ${traffic.window_s} s` : "not reported by this server")),
      h("div.stat", { dataset: { stat: "streams" } }, h("span.stat-value", streams), h("span.stat-label", "Active streams"))),
    h("div.actions", h("a.button.small.quiet", { href: "/usage" }, "Usage per day")));
}

function countsCard(counts, models) {
  const downloaded = models.filter((m) => m.status === "ready").length;
  return h("section.card", { "aria-labelledby": "ov-counts" },
    h("h2#ov-counts", "Registered"),
    h("div.stats",
      stat("Models", models.length, `${downloaded} downloaded`, "/models"),
      stat("API keys", counts.api_keys, null, "/keys"),
      stat("Requests recorded", counts.requests, null, "/requests"),
      stat("Settings", counts.settings, null, "/settings")));
}

function stat(label, value, note, href) {
  return h("a.stat", { href }, h("span.stat-value", String(value)), h("span.stat-label", label),
    note ? h("span.stat-note", note) : null);
}

// The machine: CPUs, memory and the free disk where the data and the models live (system.get).
function machineCard(m) {
  const unknown = "could not be read";
  const space = (free, total, label) => (free === null || total === null ? unknown
    : h("div.machine-fact", progressBar((total - free) / Math.max(1, total), label),
      h("span", `${formatBytes(free)} free of ${formatBytes(total)}`)));
  const memory = m.memory_total_bytes === null ? unknown
    : h("div.machine-fact",
      m.memory_available_bytes === null ? null
        : progressBar((m.memory_total_bytes - m.memory_available_bytes) / Math.max(1, m.memory_total_bytes), "Memory in use"),
      h("span", m.memory_available_bytes === null ? `${formatBytes(m.memory_total_bytes)} in all`
        : `${formatBytes(m.memory_available_bytes)} available of ${formatBytes(m.memory_total_bytes)}`));
  return h("section.card.machine-card", { "aria-labelledby": "ov-machine" },
    h("h2#ov-machine", "Machine"),
    definitionList([
      ["CPUs", m.cpu_count === null ? unknown : String(m.cpu_count)],
      ["Memory", memory],
      ["Disk (data)", space(m.data_dir_free_bytes, m.data_dir_total_bytes, "Data disk in use")],
      ["Disk (models)", space(m.models_dir_free_bytes, m.models_dir_total_bytes, "Models disk in use")],
    ]));
}

function systemCard(sys) {
  const tools = sys.tools.map((t) => h("li", h("strong", t.name), " ", toolBadge(t.status),
    t.version ? ` ${t.version}` : "", t.message ? h("span.muted", ` — ${t.message}`) : ""));
  return h("section.card", { "aria-labelledby": "ov-system" },
    h("h2#ov-system", "System"),
    definitionList([
      ["Version", sys.version],
      ["Up for", formatDuration(sys.uptime_s)],
      ["Data directory", h("code", sys.data_dir)],
      ["Models directory", h("code", sys.models_dir)],
    ]),
    h("h3", "Tools"), h("ul.tools", tools));
}

// A tool is found or not: its own words (available, missing, error), not a model's state.
function toolBadge(status) {
  return h(`span.badge.status-${String(status).replace(/[^a-z_-]/gi, "")}`, String(status));
}

function gpuSection(gpus) {
  const section = h("section.card.wide", { "aria-labelledby": "ov-gpus" }, h("h2#ov-gpus", "GPUs"));
  if (gpus.status === "missing") {
    section.append(empty("No NVIDIA driver or NVML library was found on this machine, so no GPUs are shown. "
      + "vLLM can still run on the CPU build."));
    return section;
  }
  if (gpus.status === "error") {
    section.append(h("p.error-text", { role: "alert" }, `NVML failed: ${gpus.message}`));
    return section;
  }
  if (!gpus.gpus.length) {
    section.append(empty("NVML answered, but reports no GPU."));
    return section;
  }
  section.append(h("div.gpu-grid", gpus.gpus.map((g) => {
    const used = g.memory_used_bytes / Math.max(1, g.memory_total_bytes);
    return h("article.gpu",
      h("h3", `GPU ${g.index}: ${g.name}`),
      progressBar(used, `GPU ${g.index} memory`),
      h("p.muted", `${formatBytes(g.memory_used_bytes)} of ${formatBytes(g.memory_total_bytes)} used`),
      definitionList([
        ["Utilization", g.utilization_percent === null ? "—" : `${g.utilization_percent} %`],
        ["Temperature", g.temperature_c === null ? "—" : `${g.temperature_c} °C`],
        ["Processes", String(g.processes.length)],
      ]));
  })));
  return section;
}

export function definitionList(rows) {
  return h("dl.facts", rows.map(([k, v]) => [h("dt", k), h("dd", v)]));
}
