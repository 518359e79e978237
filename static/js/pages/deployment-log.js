// A deployment card's vLLM log (deployments.logs) on the deployments page (pages/deployments.js):
// `instanceLog(name, path, signal)` returns {element, toggle(open), changed(instance)}; the card
// calls `changed` with its instance at each of its events, and the log is read only while open.
//
// API: GET /api/deployments/{name}/logs?tail=LOG_TAIL (`path("/logs")`): when it opens, when its
// instance changes, and by its Refresh button (no polling).
import { api } from "../api.js";
import { errorSlot, h, showError } from "../ui.js";

const LOG_TAIL = 500; // lines of an instance's log shown
let serial = 0;

// The instance's vLLM log (deployments.logs), shown while open: fetched when it opens, when the
// card's instance changes (its events), and by Refresh. One request at a time: a change meanwhile
// asks once more when it ends, so a burst of events is at most two requests.
export function instanceLog(name, path, signal) {
  serial += 1;
  const pre = h("pre.log.deployment-log-lines", { "aria-label": `vLLM log of ${name}`, tabindex: "0", hidden: true });
  const hint = h("p.hint", "Reading the log…");
  const refresh = h("button.button", { type: "button" }, "Refresh");
  const error = errorSlot();
  const element = h(`section#deployment-log-${serial}.deployment-log`, { "aria-label": `Log of ${name}`, hidden: true },
    h("div.deployment-log-head", h("h4", "vLLM log"), h("span.hint", `last ${LOG_TAIL} lines`), refresh),
    hint, pre, error);
  let open = false;
  let reading = false;
  let again = false;
  let seen = null; // the instance, as JSON, when the log was last asked for

  const show = (lines) => {
    hint.hidden = lines.length > 0;
    hint.textContent = "No output yet: vLLM's output appears here once this deployment loads.";
    pre.hidden = !lines.length;
    const text = lines.join("\n");
    if (text === pre.textContent) return;
    const following = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    pre.textContent = text;
    if (following) pre.scrollTop = pre.scrollHeight;
  };

  const read = async () => {
    if (!open || signal.aborted) return;
    if (reading) {
      again = true;
      return;
    }
    reading = true;
    again = false;
    refresh.toggleAttribute("aria-busy", true);
    try {
      const answer = await api("GET", path("/logs"), undefined, { query: { tail: LOG_TAIL }, signal });
      show(answer.lines || []);
      showError(error, null);
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401) return;
      showError(error, err);
    } finally {
      reading = false;
      refresh.toggleAttribute("aria-busy", false);
      if (again) read();
    }
  };

  refresh.addEventListener("click", read);
  return {
    element,
    toggle(on) {
      open = on;
      element.hidden = !on;
      if (on) read();
    },
    changed(instance) {
      const now = JSON.stringify(instance || {});
      if (now === seen) return;
      seen = now;
      read();
    },
  };
}
