// The top bar's "vLLM: …" (index.html #topbar-status): every vLLM that runs, counted by state
// ("vLLM: 2 serving, 1 loading", "vLLM: none serving"), as a link to the deployments page; empty
// while it is not known (signed out, or a stream is reconnecting).
//
// It follows two event streams while signed in (main.js starts and stops it):
// - GET /api/deployments/events: every deployment with its instance at connect, then each change,
//   `deleted` once one is gone (docs/router.md, "Events");
// - GET /api/runtime/events?log=false: the runtime's state. A model that runtime.start runs from a
//   path is no deployment, so the runtime is counted too, unless a deployment's instance is the
//   runtime's own process group (runtime.switch runs a deployment as the runtime: counted once).
// A stream that fails or ends (the server stopping) is reconnected RECONNECT_MS later; a 401 (the
// sign-in page takes over) or a 403 (this credential may not read them) on either ends both until
// the next sign-in.
import { events } from "./api.js";
import { credential } from "./session.js";
import { instanceWord } from "./states.js";
import { sleep } from "./ui.js";

const RECONNECT_MS = 2000;
// The bar is drawn at most this often, so a connect's burst (one event per deployment) shows once.
const DRAW_MS = 100;
// A state (an instance's, docs/router.md, or the runtime's, docs/runtime.md) is counted under its
// word (states.js, the same on every page). Not running: not counted.
const NOT_RUNNING = new Set(["unloaded", "stopped"]);
const ORDER = ["serving", "loading", "sleeping", "stopping", "failed"];

// "2 serving, 1 loading" for these states, in ORDER (other words after, alphabetically); "none serving".
export function summarize(states) {
  const counts = new Map();
  for (const state of states) {
    if (!state || NOT_RUNNING.has(state)) continue;
    const word = instanceWord(state);
    counts.set(word, (counts.get(word) || 0) + 1);
  }
  if (!counts.size) return "none serving";
  const rank = (word) => (ORDER.includes(word) ? ORDER.indexOf(word) : ORDER.length);
  return [...counts]
    .sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b))
    .map(([word, n]) => `${n} ${word}`)
    .join(", ");
}

let feed = null; // the AbortController of the subscription running now

function show(text) {
  const slot = document.getElementById("topbar-status");
  const link = slot.querySelector("a");
  link.textContent = text ? `vLLM: ${text}` : "";
  link.hidden = !text;
}

export function followStatus() {
  if (feed || !credential()) return;
  const controller = new AbortController();
  feed = controller;
  const { signal } = controller;
  const instances = new Map(); // deployment name → its instance, while its stream is open
  let listing = false; // the deployments stream is open (its first events are every deployment)
  let runtime = null; // the runtime's status, while its stream is open
  let timer = null;

  const states = () => {
    const all = [...instances.values()];
    const own = runtime.pgid !== null && runtime.pgid !== undefined
      && all.some((inst) => inst.pgid === runtime.pgid); // the runtime runs this deployment
    return [...all.map((inst) => inst.state), ...(own ? [] : [runtime.state])];
  };
  const draw = () => {
    timer = null;
    if (!signal.aborted) show(listing && runtime ? summarize(states()) : "");
  };
  const redraw = () => {
    if (!timer) timer = setTimeout(draw, DRAW_MS);
  };

  follow("/deployments/events", {
    opened() {
      instances.clear();
      listing = true;
      redraw();
    },
    received(type, data) {
      if (type === "deployment" && data && data.deployment) {
        instances.set(data.deployment.name, data.deployment.instance || {});
      } else if (type === "deleted" && data && typeof data.name === "string") {
        instances.delete(data.name);
      } else return;
      redraw();
    },
    lost() {
      listing = false;
      instances.clear();
      redraw();
    },
  }, controller);
  follow("/runtime/events?log=false", {
    opened() {},
    received(type, data) {
      if (type !== "state" || !data || !data.status) return;
      runtime = data.status;
      redraw();
    },
    lost() {
      runtime = null;
      redraw();
    },
  }, controller);

  signal.addEventListener("abort", () => {
    clearTimeout(timer);
    show("");
    if (feed === controller) feed = null;
  }, { once: true });
}

// One stream, reconnected after it fails or ends, until `controller` aborts; a 401 or 403 aborts it.
async function follow(path, { opened, received, lost }, controller) {
  const { signal } = controller;
  while (!signal.aborted) {
    try {
      await events(path, received, { signal, onOpen: opened });
    } catch (error) {
      if (signal.aborted || error.name === "AbortError") return;
      if (error.status === 401 || error.status === 403) {
        controller.abort();
        return;
      }
    }
    if (signal.aborted) return;
    lost(); // unknown until the stream is back
    await sleep(RECONNECT_MS, signal);
  }
}

export function stopStatus() {
  if (feed) feed.abort();
  feed = null;
}
