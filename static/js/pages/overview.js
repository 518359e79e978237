// Overview: the machine (system, tools, GPUs with memory bars), the runtime and the deployments'
// instances, and record counts. One call (GET /api/dashboard) plus GET /api/runtime (its
// `instances`: every deployment's) and /api/models, refreshed every 5 s.
import { api } from "../api.js";
import { summarize } from "../status.js";
import { badge, clear, empty, every, formatBytes, formatDuration, h, humanError, pageHeader, placeholder, progressBar } from "../ui.js";

export async function render(root, page) {
  const body = h("div.overview", placeholder(6));
  root.append(pageHeader("Overview", "The machine, the vLLM runtime and what is registered."), body);
  const refresh = async () => {
    try {
      const [dash, runtime, models] = await Promise.all([
        api("GET", "/dashboard", undefined, { signal: page.signal }),
        api("GET", "/runtime", undefined, { signal: page.signal }),
        api("GET", "/models", undefined, { signal: page.signal }),
      ]);
      clear(body, runtimeCard(runtime, models.models), countsCard(dash.counts, models.models), systemCard(dash.system),
        gpuSection(dash.gpus));
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      clear(body, h("p.error-text", { role: "alert" }, `Could not load the overview: ${humanError(error)}`));
    }
  };
  await refresh();
  every(5000, refresh, page);
}

function runtimeCard(rt, models) {
  // A registered model by its name; a model started by path or Hub id as it was given.
  const registered = models.find((m) => m.id === rt.active_model_id);
  const rows = [["State", badge(rt.state)], ["Model", registered ? registered.name : rt.model || "—"]];
  if (rt.pid) rows.push(["PID", String(rt.pid)]);
  if (rt.port) rows.push(["Port", String(rt.port)]);
  if (rt.uptime_s !== null && rt.uptime_s !== undefined) rows.push(["Up for", formatDuration(rt.uptime_s)]);
  rows.push(["Gateway upstream", rt.upstream || "—"]);
  if (rt.error) rows.push(["Last error", rt.error]);
  rows.push(["Deployments", (rt.instances || []).length ? summarize(rt.instances.map((i) => i.state)) : "none yet"]);
  // Models start as deployments (loaded side by side, or on demand); the runtime page runs one alone.
  const action = rt.state === "stopped"
    ? h("a.button", { href: "/deployments" }, "Start a model")
    : h("a.button", { href: "/runtime" }, "Open runtime");
  return h("section.card", { "aria-labelledby": "ov-runtime" },
    h("h2#ov-runtime", "Runtime"),
    definitionList(rows),
    h("div.actions", action));
}

function countsCard(counts, models) {
  const ready = models.filter((m) => m.status === "ready").length;
  return h("section.card", { "aria-labelledby": "ov-counts" },
    h("h2#ov-counts", "Registered"),
    h("div.stats",
      stat("Models", models.length, `${ready} ready`, "/models"),
      stat("API keys", counts.api_keys, null, "/keys"),
      stat("Requests recorded", counts.requests, null, "/requests"),
      stat("Settings", counts.settings, null, "/settings")));
}

function stat(label, value, note, href) {
  return h("a.stat", { href }, h("span.stat-value", String(value)), h("span.stat-label", label),
    note ? h("span.stat-note", note) : null);
}

function systemCard(sys) {
  const tools = sys.tools.map((t) => h("li", h("strong", t.name), " ", badge(t.status),
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
