// Runtime (/runtime, linked from the deployments page; not in the navigation): what vLLM runs now,
// run a ready model alone with options (runtime.switch saves it as a deployment and stops every
// other vLLM, docs/router.md), restart or stop it, its live log, and, when it failed, why (error,
// exit code, last lines).
//
// API: GET /api/runtime, GET /api/models (the ready models to run) and GET /api/methods (the
// options form is generated from runtime.switch's published input schema, see ../schema-form.js)
// once; then the Server-Sent Events of GET /api/runtime/events: the state and the log's last lines
// at once, then each state change and each new log line (no polling; one GET /api/runtime while the
// stream reconnects). POST /api/runtime/switch {model_id, options} (Start and Switch) and
// POST /api/runtime/restart (same model, same options) answer 202 at once with state "starting":
// the page shows the start's progress, then, from the events, "ready" or the failure with vLLM's
// last lines. POST /api/runtime/stop (it cancels a start that is still loading).
//
// States are shown in the console's words (../states.js: loading, serving, stopping, stopped,
// failed); the server's own ("ready") stay in data-state. A failed start's reason (the status's
// `error`: vLLM's own words, docs/runtime.md "Failed starts") is said next to the button that began
// it and in the state card above Restart. While it serves, the state card offers the next steps:
// Chat (/chat?model=<served name>) and Connect a client (/?model=<served name>#connect).
import { api, events, readWithMethods } from "../api.js";
import { schemaForm, resolveSchema } from "../schema-form.js";
import { runtimeWord, stateBadge } from "../states.js";
import {
  clear, confirmDialog, empty, errorSlot, every, field, formatDuration, formatTime, h, humanError,
  pageHeader, placeholder, showError, sleep, toast,
} from "../ui.js";

const RUNNING = new Set(["starting", "ready", "stopping"]);
const LOG_TAIL = 200;
const RECONNECT_MS = 2000;
const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM" };
// Where a state stands in one start's life: an answer older than what the events said is ignored.
const RANK = { starting: 0, ready: 1, stopping: 2, stopped: 3, failed: 3 };

export async function render(root, page) {
  const body = h("div.runtime", placeholder(10));
  root.append(pageHeader("Runtime", "Run one model alone with vLLM (every other one stops), follow its log, restart or stop it."),
    h("p.page-aside", "To load several models side by side, or on demand: ",
      h("a", { href: "/deployments" }, "Deployments page"), "."),
    body);

  const get = (path, query) => api("GET", path, undefined, { query, signal: page.signal });
  let status;
  let models;
  let methods;
  try {
    [status, models, methods] = await readWithMethods(["/runtime", "/models"], { signal: page.signal });
  } catch (error) {
    if (error.name === "AbortError" || error.status === 401) return;
    clear(body, h("p.error-text", { role: "alert" }, `Could not load the runtime: ${humanError(error)}`));
    return;
  }
  const ready = models.models.filter((m) => m.status === "ready");
  const names = new Map(models.models.map((m) => [m.id, m.name]));
  let busy = null; // a run action whose POST is in flight: "start" | "switch" | "restart"
  let pending = null; // a start this page began, until it settles: {action, pgid, slot, name}
  let stopping = false; // a stop this page asked for (it may cancel a start that is still loading)
  let receivedAt = performance.now(); // when `status` arrived (its starting_for_s was true then)
  const logLines = [];

  // --- current state -----------------------------------------------------------------------------
  const facts = h("dl.facts");
  const stateNote = h("p.hint.state-note", { hidden: true });
  const refreshError = h("p.error-text", { role: "alert", hidden: true });
  const restartButton = h("button.button", { type: "button" }, "Restart");
  const stopButton = h("button.button.danger", { type: "button" }, "Stop");
  const chatLink = h("a.button.primary", { "data-action": "chat", hidden: true }, "Chat");
  const connectLink = h("a.button", { "data-action": "connect", hidden: true }, "Connect a client");
  const controlError = errorSlot();
  const stateCard = h("section.card.runtime-state", { "aria-labelledby": "rt-state" },
    h("h2#rt-state", "Current state"), facts, stateNote,
    h("div.actions", chatLink, connectLink, restartButton, stopButton), controlError, refreshError);

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
    field("Model", select, "A downloaded model. Switch stops what runs now, then starts this one with these options; Restart keeps the model and its options."),
    details,
    h("div.actions", submit),
    runError);
  if (ready.length) runCard.append(form);
  else {
    runCard.append(empty("No model is downloaded yet: download or register a model first.",
      h("a.button", { href: "/models" }, "Go to Models")));
  }

  // --- log ---------------------------------------------------------------------------------------
  const log = h("pre.log.runtime-log", { "aria-label": "vLLM log", tabindex: "0" });
  const logEmpty = h("p.hint", "No output yet: vLLM's output appears here once it starts.");
  const liveNote = h("span.hint.runtime-live", { role: "status" }, `last ${LOG_TAIL} lines, connecting…`);
  const logCard = h("section.card.runtime-log-card", { "aria-labelledby": "rt-log" },
    h("div.log-head", h("h2#rt-log", "vLLM log"), liveNote),
    logEmpty, log);

  clear(body, stateCard, failureSlot, runCard, logCard);

  // --- rendering ---------------------------------------------------------------------------------
  const modelName = (st) => (st.active_model_id && names.get(st.active_model_id)) || st.model || "—";

  const showState = () => {
    const st = status;
    stateCard.dataset.state = st.state;
    const live = RUNNING.has(st.state);
    const rows = [["State", stateBadge(runtimeWord(st.state))], [live ? "Model" : "Last model", st.model ? modelName(st) : "—"]];
    if (live && st.options && st.options.served_model_name) rows.push(["Served as", h("code", st.options.served_model_name)]);
    if (st.pid) rows.push(["PID", String(st.pid)]);
    if (live && st.port) rows.push(["Port", String(st.port)]);
    if (st.state === "ready") rows.push(["Up for", formatDuration(st.uptime_s)]);
    else if (st.started_at && RUNNING.has(st.state)) rows.push(["Started", formatTime(st.started_at)]);
    if (st.state === "starting" && st.starting_for_s !== null && st.starting_for_s !== undefined) {
      const loading = st.starting_for_s + (performance.now() - receivedAt) / 1000;
      rows.push(["Loading for", `${formatDuration(loading)} of at most ${formatDuration(st.start_timeout_s)}`]);
    }
    // vLLM's own port skips keys and audit: labelled as internal; clients use this server's /v1.
    rows.push(["/v1 forwards to", st.upstream
      ? [h("code", st.upstream), h("span.hint.runtime-internal", " (internal: clients use this server's /v1)")] : "—"]);
    if (st.error && st.state !== "failed") rows.push(["Last error", st.error]);
    clear(facts, rows.map(([k, v]) => [h("dt", k), h("dd", v)]));

    const notes = {
      starting: "vLLM is loading the model; this can take minutes. Stop cancels it.",
      stopping: "vLLM is stopping.",
      stopped: ready.length ? "Nothing runs: choose a model below and press Start." : "Nothing runs.",
    };
    if (st.state === "failed") notes.failed = `Failed: ${sentence(st.error || "vLLM stopped on its own")}`;
    const note = busy && !live ? "Starting vLLM…" : notes[st.state];
    // Next steps while it serves: the name clients send (a path run by runtime.start: vLLM's own).
    const served = (st.options && st.options.served_model_name) || st.deployment || st.model;
    const serving = st.state === "ready" && Boolean(served);
    chatLink.hidden = !serving;
    connectLink.hidden = !serving;
    if (serving) {
      chatLink.href = `/chat?model=${encodeURIComponent(served)}`;
      connectLink.href = `/?model=${encodeURIComponent(served)}#connect`;
    }
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
    // The action this page began, while its POST is out or its start loads.
    const ongoing = busy || (pending && state === "starting" ? pending.action : null);
    const label = { start: "Starting…", switch: "Switching…" }[ongoing] || (running ? "Switch" : "Start");
    submit.textContent = label;
    const unchanged = running && select.value === status.active_model_id && !optionsChanged();
    submit.disabled = Boolean(busy) || stopping || state === "starting" || state === "stopping" || !select.value
      || unchanged;
    submit.toggleAttribute("aria-busy", busy === "start" || busy === "switch");

    restartButton.hidden = !(state === "ready" || state === "failed" || ongoing === "restart");
    restartButton.textContent = ongoing === "restart" ? "Restarting…" : "Restart";
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

  // A log event: the last lines afresh (`reset`: a new connection, or a new vLLM), or new lines.
  const addLog = ({ reset, lines }) => {
    if (reset) logLines.length = 0;
    logLines.push(...lines);
    if (logLines.length > LOG_TAIL) logLines.splice(0, logLines.length - LOG_TAIL);
    showLog(logLines);
  };

  // Take a status: the events' always (they come in order); an answer to a request only when the
  // events have not already said something newer about the same vLLM.
  const setStatus = (st, fromEvents = false) => {
    const stale = !fromEvents && status && st.pgid === status.pgid && RANK[st.state] < RANK[status.state];
    if (!stale) {
      status = st;
      receivedAt = performance.now();
    }
    showState();
    settle();
  };

  // The start this page began has left "starting": say how it ended, next to what began it.
  const settle = () => {
    if (!pending || status.pgid !== pending.pgid || status.state === "starting") return;
    const done = pending;
    pending = null;
    syncButtons();
    if (status.state === "ready") {
      toast(done.action === "restart" ? `${done.name} restarted and is serving.` : `${done.name} is serving.`, "ok");
    } else if (status.state === "failed") {
      showError(done.slot, `vLLM failed to start: ${sentence(status.error || "it stopped on its own")} Its last lines are above.`);
    } else {
      showError(done.slot, "The start was canceled.");
    }
  };

  const refresh = async () => {
    try {
      setStatus(await get("/runtime"));
      refreshError.hidden = true;
    } catch (error) {
      if (error.name === "AbortError" || error.status === 401) return;
      refreshError.hidden = false;
      refreshError.textContent = `Could not refresh the state: ${humanError(error)}`;
    }
  };

  const setLive = (on) => {
    liveNote.textContent = on ? `last ${LOG_TAIL} lines, live` : "Live updates were interrupted; reconnecting…";
  };

  // Follow the event stream until the page is left; reconnect RECONNECT_MS after it ends or fails.
  const follow = async () => {
    while (!page.signal.aborted) {
      try {
        await events("/runtime/events", (type, data) => {
          setLive(true);
          refreshError.hidden = true;
          if (type === "state" && data && data.status) setStatus(data.status, true);
          else if (type === "log" && data && Array.isArray(data.lines)) addLog(data);
        }, { signal: page.signal });
      } catch (error) {
        if (page.signal.aborted || error.name === "AbortError" || error.status === 401) return;
      }
      if (page.signal.aborted) return;
      setLive(false); // failed, or the server closed the stream (it is stopping): try again
      await refresh();
      await sleep(RECONNECT_MS, page.signal);
    }
  };

  // --- actions -----------------------------------------------------------------------------------
  // Start/Switch/Restart answer 202 at once (state "starting"); the events then say how the start
  // ends (`settle`). Returns the answer, or null when the page was left meanwhile.
  const act = async (name, slot, label, call) => {
    busy = name;
    showError(slot, null);
    showState();
    try {
      const st = await call();
      pending = { action: name, pgid: st.pgid, slot, name: label || modelName(st) };
      setStatus(st);
      return st;
    } catch (error) {
      if (error.name === "AbortError") return null;
      throw error;
    } finally {
      busy = null;
      if (!page.signal.aborted) showState();
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
      await act(action, runError, names.get(modelId) || "The model",
        () => api("POST", "/runtime/switch", body, { signal: page.signal }));
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
      await act("restart", controlError, null, () => api("POST", "/runtime/restart", {}, { signal: page.signal }));
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
      setStatus(await api("POST", "/runtime/stop", undefined, { signal: page.signal }));
      toast("vLLM stopped.", "ok");
    } catch (error) {
      if (error.name !== "AbortError" && error.status !== 401) showError(controlError, error);
    } finally {
      stopping = false;
      if (!page.signal.aborted) syncButtons();
    }
  });

  showState();
  showLog(logLines);
  follow();
  // While a start loads, its "Loading for" counts up between events.
  every(1000, () => status.state === "starting" && showState(), page);

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
