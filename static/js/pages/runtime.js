// Runtime: what vLLM runs now, run a ready model with options, restart or stop it, its live log,
// and, when it failed, why (error, exit code, last lines).
//
// API: GET /api/runtime and GET /api/runtime/logs?tail=200 every 2 s; GET /api/models (the ready
// models to run); GET /api/methods (the options form is generated from runtime.switch's published
// input schema, see ../schema-form.js); POST /api/runtime/switch {model_id, options} (Start and
// Switch: it answers once vLLM is healthy), POST /api/runtime/restart (same model, same options),
// POST /api/runtime/stop.
import { api } from "../api.js";
import { schemaForm, resolveSchema } from "../schema-form.js";
import {
  badge, clear, confirmDialog, empty, errorSlot, every, field, formatDuration, formatTime, h, humanError,
  pageHeader, placeholder, showError, toast,
} from "../ui.js";

const RUNNING = new Set(["starting", "ready", "stopping"]);
const LOG_TAIL = 200;
const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM" };

export async function render(root, page) {
  const body = h("div.runtime", placeholder(10));
  root.append(pageHeader("Runtime", "Run a model with vLLM, follow its log, restart or stop it."), body);

  const get = (path, query) => api("GET", path, undefined, { query, signal: page.signal });
  let status;
  let models;
  let methods;
  let firstLog;
  try {
    [status, models, methods, firstLog] = await Promise.all([
      get("/runtime"),
      get("/models"),
      get("/methods").catch((error) => {
        if (error.name === "AbortError" || error.status === 401) throw error;
        return { error };
      }),
      get("/runtime/logs", { tail: LOG_TAIL }),
    ]);
  } catch (error) {
    if (error.name === "AbortError" || error.status === 401) return;
    clear(body, h("p.error-text", { role: "alert" }, `Could not load the runtime: ${humanError(error)}`));
    return;
  }
  const ready = models.models.filter((m) => m.status === "ready");
  const names = new Map(models.models.map((m) => [m.id, m.name]));
  let busy = null; // the run action this page is waiting for: "start" | "switch" | "restart"
  let stopping = false; // a stop this page asked for (it may cancel a start that is still loading)

  // --- current state -----------------------------------------------------------------------------
  const facts = h("dl.facts");
  const stateNote = h("p.hint.state-note", { hidden: true });
  const refreshError = h("p.error-text", { role: "alert", hidden: true });
  const restartButton = h("button.button", { type: "button" }, "Restart");
  const stopButton = h("button.button.danger", { type: "button" }, "Stop");
  const controlError = errorSlot();
  const stateCard = h("section.card.runtime-state", { "aria-labelledby": "rt-state" },
    h("h2#rt-state", "Current state"), facts, stateNote,
    h("div.actions", restartButton, stopButton), controlError, refreshError);

  // --- failure -----------------------------------------------------------------------------------
  const failureSlot = h("div.failure-slot");
  let failureShown = "";

  // --- run a model -------------------------------------------------------------------------------
  const runCard = h("section.card.runtime-run", { "aria-labelledby": "rt-run" }, h("h2#rt-run", "Run a model"));
  const select = h("select", { name: "model_id" },
    ready.map((m) => h("option", { value: m.id }, m.name)));
  if (status.active_model_id && ready.some((m) => m.id === status.active_model_id)) select.value = status.active_model_id;
  const submit = h("button.button.primary", { type: "submit" }, "Start");
  const runError = errorSlot();
  const options = optionsForm(methods);
  const details = h("details.runtime-options",
    h("summary", "Options"),
    h("p.hint", "Empty fields leave vLLM's own default. The server checks every value when you press Start or Switch."),
    options.element);
  const form = h("form.run-form", { novalidate: true },
    field("Model", select, "A ready registered model. Switch stops what runs now, then starts this one with these options; Restart keeps the model and its options."),
    details,
    h("div.actions", submit),
    runError);
  if (ready.length) runCard.append(form);
  else {
    runCard.append(empty("No model is ready to run: download or register a model first.",
      h("a.button", { href: "/models" }, "Go to Models")));
  }

  // --- log ---------------------------------------------------------------------------------------
  const log = h("pre.log.runtime-log", { "aria-label": "vLLM log", tabindex: "0" });
  const logEmpty = h("p.hint", "No output yet: vLLM's output appears here once it starts.");
  const logCard = h("section.card.runtime-log-card", { "aria-labelledby": "rt-log" },
    h("div.log-head", h("h2#rt-log", "vLLM log"), h("span.hint", `last ${LOG_TAIL} lines, refreshed every 2 s`)),
    logEmpty, log);

  clear(body, stateCard, failureSlot, runCard, logCard);

  // --- rendering ---------------------------------------------------------------------------------
  const modelName = (st) => (st.active_model_id && names.get(st.active_model_id)) || st.model || "—";

  const showState = () => {
    const st = status;
    stateCard.dataset.state = st.state;
    const live = RUNNING.has(st.state);
    const rows = [["State", badge(st.state)], [live ? "Model" : "Last model", st.model ? modelName(st) : "—"]];
    if (live && st.options && st.options.served_model_name) rows.push(["Served as", h("code", st.options.served_model_name)]);
    if (st.pid) rows.push(["PID", String(st.pid)]);
    if (live && st.port) rows.push(["Port", String(st.port)]);
    if (st.state === "ready") rows.push(["Up for", formatDuration(st.uptime_s)]);
    else if (st.started_at && RUNNING.has(st.state)) rows.push(["Started", formatTime(st.started_at)]);
    rows.push(["Gateway upstream", st.upstream ? h("code", st.upstream) : "—"]);
    if (st.error && st.state !== "failed") rows.push(["Last error", st.error]);
    clear(facts, rows.map(([k, v]) => [h("dt", k), h("dd", v)]));

    const notes = {
      starting: "vLLM is loading the model; this can take minutes. Stop cancels it.",
      stopping: "vLLM is stopping.",
      stopped: ready.length ? "Nothing runs: choose a model below and press Start." : "Nothing runs.",
    };
    const note = busy && !live ? "Starting vLLM…" : notes[st.state];
    stateNote.hidden = !note;
    stateNote.textContent = note || "";
    showFailure(st);
    syncButtons();
  };

  const showFailure = (st) => {
    const key = st.state === "failed" ? JSON.stringify([st.error, st.exit_code, st.last_lines]) : "";
    if (key === failureShown) return;
    failureShown = key;
    if (!key) {
      clear(failureSlot);
      return;
    }
    const lines = st.last_lines || [];
    clear(failureSlot, h("section.card.runtime-failure", { role: "alert", "aria-labelledby": "rt-failure" },
      h("h2#rt-failure", "vLLM failed"),
      h("p.failure-reason", sentence(st.error || "vLLM stopped on its own.")),
      h("dl.facts", h("dt", "Model"), h("dd", modelName(st)), h("dt", "Exit code"), h("dd", exitCodeText(st.exit_code))),
      h("h3", "Last lines"),
      lines.length ? h("pre.log", { "aria-label": "Last lines before the failure", tabindex: "0" }, lines.join("\n"))
        : h("p.hint", "vLLM wrote nothing before it stopped."),
      h("p.hint", "Fix the cause (often an option or the memory), then press Start, or Restart to try the same again.")));
  };

  const syncButtons = () => {
    const { state } = status;
    const running = RUNNING.has(state);
    const label = { start: "Starting…", switch: "Switching…" }[busy] || (running ? "Switch" : "Start");
    submit.textContent = label;
    const unchanged = running && select.value === status.active_model_id && !optionsChanged();
    submit.disabled = Boolean(busy) || stopping || state === "starting" || state === "stopping" || !select.value
      || unchanged;
    submit.toggleAttribute("aria-busy", busy === "start" || busy === "switch");

    restartButton.hidden = !(state === "ready" || state === "failed" || busy === "restart");
    restartButton.textContent = busy === "restart" ? "Restarting…" : "Restart";
    restartButton.disabled = Boolean(busy) || stopping || state === "stopping";
    restartButton.toggleAttribute("aria-busy", busy === "restart");

    stopButton.hidden = !(running || busy || stopping);
    stopButton.textContent = stopping ? "Stopping…" : "Stop";
    stopButton.disabled = stopping || state === "stopping";
    stopButton.toggleAttribute("aria-busy", stopping);
  };

  // Whether the form asks for other options than those of what runs now (Switch then makes sense
  // for the same model). switch sets served_model_name to the model's name when it is left empty.
  const optionsChanged = () => {
    const { values, errors } = options.collect();
    if (Object.keys(errors).length) return true;
    const wanted = options.normalize(values);
    const current = options.normalize(status.options);
    if (!("served_model_name" in wanted) && current.served_model_name === names.get(status.active_model_id)) {
      delete current.served_model_name;
    }
    return JSON.stringify(wanted) !== JSON.stringify(current);
  };

  const showLog = (lines) => {
    const text = lines.join("\n");
    logEmpty.hidden = lines.length > 0;
    if (text === log.textContent) return;
    // Follow the end unless the reader scrolled up to read something.
    const following = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
    log.textContent = text;
    if (following) log.scrollTop = log.scrollHeight;
  };

  let polling = false;
  const refresh = async () => {
    if (polling) return;
    polling = true;
    try {
      const [st, lines] = await Promise.all([get("/runtime"), get("/runtime/logs", { tail: LOG_TAIL })]);
      status = st;
      showState();
      showLog(lines.lines);
      refreshError.hidden = true;
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      refreshError.hidden = false;
      refreshError.textContent = `Could not refresh the state: ${humanError(error)}`;
    } finally {
      polling = false;
    }
  };

  // --- actions -----------------------------------------------------------------------------------
  // Run Start/Switch/Restart (they answer once vLLM is healthy); returns the new status, or null
  // when the page was left meanwhile. The button shows the action until then.
  const act = async (name, slot, call) => {
    busy = name;
    showError(slot, null);
    showState();
    setTimeout(() => page.signal.aborted || refresh(), 300); // the state turns "starting" at once
    try {
      status = await call();
      return status;
    } catch (error) {
      if (error.name === "AbortError") return null;
      throw error;
    } finally {
      busy = null;
      if (!page.signal.aborted) {
        syncButtons();
        refresh();
      }
    }
  };

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (busy || submit.disabled) return;
    showError(runError, null);
    const { values, errors } = options.collect();
    if (Object.keys(errors).length) {
      placeErrors(errors);
      return;
    }
    options.clearErrors();
    const modelId = select.value;
    const body = { model_id: modelId };
    if (Object.keys(values).length) body.options = values;
    const action = RUNNING.has(status.state) ? "switch" : "start";
    try {
      const st = await act(action, runError, () => api("POST", "/runtime/switch", body, { signal: page.signal }));
      if (st) toast(`${names.get(modelId) || "The model"} is ready.`, "ok");
    } catch (error) {
      if (error.status === 401) return;
      placeErrors(error.fieldErrors, "options", error);
    }
  });

  // Field errors go next to their fields (opening Options when they are in it); whatever has no
  // field here (a check across options, a conflict, an unreachable server) goes by the button.
  const placeErrors = (fieldErrors, prefix = "", error = null) => {
    const { unplaced, first } = options.showErrors(fieldErrors, prefix);
    if (first) {
      if (details.contains(first)) details.open = true;
      first.focus();
    }
    if (unplaced.length) showError(runError, unplaced.map(([key, message]) => `${key}: ${message}`).join("; "));
    else if (first) showError(runError, "Some options need a change: see the messages next to them.");
    else showError(runError, error);
  };

  for (const type of ["input", "change"]) form.addEventListener(type, () => syncButtons());

  restartButton.addEventListener("click", async () => {
    if (busy) return;
    try {
      const st = await act("restart", controlError, () => api("POST", "/runtime/restart", {}, { signal: page.signal }));
      if (st) toast(`${modelName(st)} restarted and is ready.`, "ok");
    } catch (error) {
      if (error.status !== 401) showError(controlError, error);
    }
  });

  stopButton.addEventListener("click", async () => {
    if (stopping) return;
    const loading = status.state === "starting";
    const ok = await confirmDialog(loading ? "Cancel the start?" : "Stop vLLM?",
      loading ? `vLLM is still loading ${modelName(status)}; it will be killed at once.`
        : `${modelName(status)} stops; /v1 requests fail until a model runs again.`, "Stop");
    if (!ok) return;
    stopping = true;
    showError(controlError, null);
    syncButtons();
    try {
      status = await api("POST", "/runtime/stop", undefined, { signal: page.signal });
      toast("vLLM stopped.", "ok");
    } catch (error) {
      if (error.name !== "AbortError" && error.status !== 401) showError(controlError, error);
    } finally {
      stopping = false;
      if (!page.signal.aborted) {
        syncButtons();
        refresh();
      }
    }
  });

  showState();
  showLog(firstLog.lines);
  every(2000, refresh, page);

  function optionsForm(result) {
    const schema = result && !result.error && optionsSchema(result.methods);
    if (!schema) {
      const why = result && result.error ? humanError(result.error) : "runtime.switch publishes no options";
      return {
        element: h("p.error-text", `The options could not be loaded (${why}); Start runs with vLLM's defaults.`),
        collect: () => ({ values: {}, errors: {} }),
        showErrors: () => ({ unplaced: [], first: null }),
        clearErrors: () => {},
        isEmpty: () => true,
        normalize: () => ({}),
      };
    }
    // runtime.switch takes the model from the registry: its `model` option must stay unset.
    return schemaForm(schema.options, { root: schema.root, omit: ["model"] });
  }
}

// The RuntimeOptions schema from runtime.switch's (or runtime.start's) published input schema.
function optionsSchema(methods) {
  for (const name of ["runtime.switch", "runtime.start"]) {
    const method = (methods || []).find((m) => m.name === name);
    const input = method && method.input_schema;
    const prop = input && input.properties && input.properties.options;
    if (prop) {
      const resolved = resolveSchema(prop, input).schema;
      if (resolved.properties) return { options: resolved, root: input };
    }
  }
  return null;
}

function exitCodeText(code) {
  if (code === null || code === undefined) return "— (it did not exit on its own)";
  if (code > 128 && code < 160) {
    const n = code - 128;
    return `${code} (killed by signal ${n}${SIGNALS[n] ? `, ${SIGNALS[n]}` : ""})`;
  }
  return String(code);
}

function sentence(text) {
  const t = String(text).trim();
  return /[.!?]$/.test(t) ? t : `${t}.`;
}
