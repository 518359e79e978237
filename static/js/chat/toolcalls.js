// How an answer's tool calls look (docs/chat.md, "Tools"): under the answer's text, one
// `.tool-call[data-tool-call-id][data-state]` per call with its name, its arguments (growing while
// they stream, pretty-printed once they parse), its output (live while the tool runs, then the
// result the model gets) and, where the user must decide, buttons: "Allow" / "Deny" for a call of
// a write tool, "Run again" / "Deny" for one interrupted (a reload) or refused by /tools.
// `.tool-note` says why the loop stopped, when it did (the round cap, Stop).
//
// `updateToolCalls(item, message, onDecide)` draws or refreshes them in place (the buttons are
// kept while the state stays the same, so a click never lands on a replaced node);
// `onDecide(message, index, choice)` gets "allow", "deny" or "run".

import { h } from "../ui.js";

// A call's `state` (chat/toolloop.js) in words; undefined: the model is still writing it.
const STATE_WORDS = {
  waiting: "Waiting for you: this tool can write",
  running: "Running…",
  done: "Done",
  denied: "Denied",
  interrupted: "Interrupted (the page was left while it ran)",
  skipped: "Not run",
};

const BUTTONS = {
  waiting: [["allow", "Allow"], ["deny", "Deny"]],
  interrupted: [["run", "Run again"], ["deny", "Deny"]],
  failed: [["run", "Run again"], ["deny", "Deny"]],
};

function pretty(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch (_) {
    return args; // still streaming, or not JSON: shown as it is
  }
}

function callNode() {
  const name = h("strong.tool-name");
  const state = h("span.tool-state");
  const args = h("pre.tool-arguments", { "aria-label": "Arguments" });
  const output = h("pre.tool-output", { "aria-label": "Output", hidden: true });
  const error = h("p.tool-error.error-text", { hidden: true });
  const actions = h("div.tool-actions");
  const node = h("div.tool-call", h("div.tool-call-head", h("span.tool-label", "Tool call "), name, state),
    args, output, error, actions);
  node.parts = { name, state, args, output, error, actions, buttonsFor: null };
  return node;
}

export function updateToolCalls(item, m, onDecide) {
  const calls = m.toolCalls || [];
  let box = item.querySelector(".tool-calls");
  if (!calls.length && !m.toolNote) {
    if (box) box.remove();
    return;
  }
  if (!box) {
    box = h("div.tool-calls", { role: "group", "aria-label": "Tool calls" }, h("p.tool-note", { hidden: true }));
    item.querySelector(".message-body").after(box);
  }
  const nodes = [...box.querySelectorAll(":scope > .tool-call")];
  calls.forEach((call, index) => {
    let node = nodes[index];
    if (!node) {
      node = callNode();
      box.querySelector(".tool-note").before(node);
    }
    const p = node.parts;
    const state = call.state || "streaming";
    node.dataset.toolCallId = call.id || "";
    node.dataset.state = state;
    if (p.name.textContent !== call.name) p.name.textContent = call.name || "…";
    const args = pretty(call.arguments || "");
    if (p.args.textContent !== args) p.args.textContent = args;
    const output = call.state === "running" ? call.output || "" : call.result ?? call.output ?? "";
    p.output.hidden = !output && call.state !== "running";
    if (p.output.textContent !== output) p.output.textContent = output;
    p.state.textContent = call.state === "failed" ? "Failed" : STATE_WORDS[state] || "";
    p.error.hidden = !call.error;
    p.error.textContent = call.error || "";
    if (p.buttonsFor !== state) {
      p.buttonsFor = state;
      p.actions.replaceChildren(...(BUTTONS[state] || []).map(([choice, label]) => h(
        choice === "deny" ? "button.button.small" : "button.button.small.primary",
        { type: "button", onclick: () => onDecide(m, index, choice) }, label)));
    }
  });
  for (const extra of nodes.slice(calls.length)) extra.remove();
  const note = box.querySelector(".tool-note");
  note.hidden = !m.toolNote;
  note.textContent = m.toolNote || "";
}
