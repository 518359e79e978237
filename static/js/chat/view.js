// How one message looks (docs/chat.md, Messages and Branches): `li.message` with data-message-id,
// data-role and data-status; the text in `.message-body` (an answer as rendered Markdown, a prompt
// as text); reasoning in a closed <details class="reasoning">; a footer with the state ("loading
// qwen…", "Stopped", an error note), `.message-stats` (time to first token, tokens/s) and the actions (Edit,
// Regenerate); a branch switcher where the message has siblings; a prompt's attachments (chat/attach.js).
//
// `messageItem(message, actions)` builds the element; `updateItem(item, message)` refreshes it in
// place while it streams (the <details> keeps its open/closed state); `editMessage(item, message,
// onSave)` puts a prompt's edit form ("Edit message", "Save and send", "Cancel") in its place.

import { errorSlot, field, h, showError } from "../ui.js";
import { attachmentList } from "./attach.js";
import { renderMarkdown } from "./markdown.js";
import { updateToolCalls } from "./toolcalls.js";

const seconds = (ms) => `${(ms / 1000).toFixed(2)} s`;

export function statsText(m) {
  const parts = [];
  if (m.firstTokenAt && m.startedAt) parts.push(`${seconds(Math.max(0, m.firstTokenAt - m.startedAt))} to first token`);
  const tokens = m.usageTokens ?? m.tokens ?? 0;
  const span = m.firstTokenAt && m.finishedAt ? (m.finishedAt - m.firstTokenAt) / 1000 : 0;
  parts.push(tokens > 1 && span > 0 ? `${((tokens - 1) / span).toFixed(1)} tokens/s` : "— tokens/s");
  parts.push(`${tokens} token${tokens === 1 ? "" : "s"}`);
  return parts.join(" · ");
}

// A request held while its model loads (chat/runner.js): "loading qwen…", and after a 503
// `model_loading` the count down to the next try.
function loadingText(m) {
  const name = `loading ${m.model || "the model"}…`;
  return m.retryIn ? `${name} still loading; asking again in ${m.retryIn} s` : name;
}

// `actions`: {siblings: [ids], onBranch(id), onEdit(message), onRegenerate(message),
// onToolDecision(message, index, choice) (chat/toolcalls.js), busy: bool}
export function messageItem(message, actions) {
  const item = h("li.message", { dataset: { messageId: message.id, role: message.role, status: message.status } });
  const author = message.role === "user" ? "You" : message.model || "Assistant";
  const head = h("div.message-head", h("span.message-author", author));
  const { siblings = [] } = actions;
  if (siblings.length > 1) {
    const index = siblings.indexOf(message.id);
    const go = (to) => actions.onBranch(siblings[to]);
    head.append(h("div.branches", { role: "group", "aria-label": "Branches" },
      h("button.button.small.quiet", { type: "button", "aria-label": "Previous branch", title: "Previous branch",
        disabled: index <= 0, onclick: () => go(index - 1) }, "‹"),
      h("span.branch-index", `${index + 1}/${siblings.length}`),
      h("button.button.small.quiet", { type: "button", "aria-label": "Next branch", title: "Next branch",
        disabled: index >= siblings.length - 1, onclick: () => go(index + 1) }, "›")));
  }
  const body = h("div.message-body");
  const state = h("span.message-state");
  const stats = h("span.message-stats", { hidden: true });
  const buttons = h("div.message-actions");
  if (message.role === "user") {
    buttons.append(h("button.button.small", { type: "button", disabled: actions.busy,
      onclick: () => actions.onEdit(message, item) }, "Edit"));
  } else {
    buttons.append(h("button.button.small", { type: "button", disabled: actions.busy,
      onclick: () => actions.onRegenerate(message) }, "Regenerate"));
  }
  item.append(head, body, h("div.message-foot", state, stats, buttons));
  if (message.attachments && message.attachments.length) body.after(attachmentList(message.attachments));
  item.parts = { body, state, stats, reasoning: null, rendered: null, onDecide: actions.onToolDecision };
  updateItem(item, message);
  return item;
}

export function updateItem(item, m) {
  const parts = item.parts;
  item.dataset.status = m.status;
  item.setAttribute("aria-busy", m.status === "streaming" ? "true" : "false");
  if (m.role === "assistant" && m.reasoning) {
    if (!parts.reasoning) {
      const text = h("div.reasoning-body");
      parts.reasoning = h("details.reasoning", h("summary", "Reasoning"), text);
      parts.reasoning.text = text;
      parts.body.before(parts.reasoning);
    }
    if (parts.reasoning.text.textContent !== m.reasoning) parts.reasoning.text.textContent = m.reasoning;
  }
  const content = m.content || "";
  if (parts.rendered !== content) {
    parts.rendered = content;
    if (m.role === "assistant") renderMarkdown(parts.body, content);
    else parts.body.textContent = content;
  }
  if (m.role === "assistant") updateToolCalls(item, m, parts.onDecide || (() => {}));
  let state = "";
  if (m.status === "streaming") {
    state = m.firstTokenAt ? "Generating…" : m.loading ? loadingText(m) : "Waiting for the first token…";
  }
  else if (m.status === "stopped") state = "Stopped";
  else if (m.status === "error") state = m.note || "The answer failed.";
  parts.state.textContent = state;
  parts.state.hidden = !state;
  parts.state.classList.toggle("error-text", m.status === "error");
  if (m.status === "stopped" && m.note) parts.state.title = m.note;
  const finished = m.role === "assistant" && (m.status === "done" || m.status === "stopped") && m.startedAt;
  parts.stats.hidden = !finished;
  parts.stats.textContent = finished ? statsText(m) : "";
}

// Edits a user message in place: a textarea "Edit message" over its body and footer (Escape
// cancels, Ctrl/Cmd+Enter saves). `onSave(text)` sends the edit as a new branch and resolves to
// true when the form should close although the thread was not redrawn (the send failed).
export function editMessage(item, message, onSave) {
  if (item.querySelector(".edit-form")) return;
  const area = h("textarea", { name: "edit", rows: 3 });
  area.value = message.content;
  const error = errorSlot();
  const body = item.querySelector(".message-body");
  const foot = item.querySelector(".message-foot");
  const close = () => {
    form.remove();
    body.hidden = false;
    foot.hidden = false;
    const edit = foot.querySelector("button");
    if (edit) edit.focus();
  };
  const form = h("form.edit-form", { novalidate: true },
    field("Edit message", area),
    h("div.actions",
      h("button.button.small.primary", { type: "submit" }, "Save and send"),
      h("button.button.small", { type: "button", onclick: close }, "Cancel")),
    error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!area.value.trim()) {
      showError(error, "The message is empty.");
      area.focus();
      return;
    }
    if (await onSave(area.value)) close();
  });
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      close();
    } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  body.hidden = true;
  foot.hidden = true;
  body.after(form);
  area.focus();
}
