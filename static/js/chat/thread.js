// The thread (docs/chat.md, Messages): the conversation's title, a hint while it has no message,
// and `ol[aria-label="Messages"]` with the messages of the selected branches (chat/tree.js), each
// drawn by chat/view.js; an answer compared side by side shows with its partner as two columns
// (`.compare`).
//
// `createThread({onBranch(id), onEdit(message, item), onRegenerate(message), onToolDecision(message,
// index, choice)})` (the last from an answer's tool calls, chat/toolcalls.js): `render(entry,
// busy)` draws a conversation ({conversation, messages}, or null for a new chat); `changed(message,
// now)` redraws one message shown, at once with `now`, else at most every RENDER_MS (a streaming
// answer's Markdown is not redrawn per chunk), keeping the view at the bottom if it was there;
// `setBusy(busy)` disables the messages' actions while the conversation streams.
// `focusBranches(id)` focuses a message's branch switcher.

import { h } from "../ui.js";
import { childrenOf, partnerOf, visiblePath } from "./tree.js";
import { messageItem, updateItem } from "./view.js";

const RENDER_MS = 50;

const nearBottom = () => window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
export const toBottom = () => window.scrollTo({ top: document.documentElement.scrollHeight });

export function createThread({ onBranch, onEdit, onRegenerate, onToolDecision }) {
  const title = h("h2.thread-title", "New chat");
  const list = h("ol.messages", { "aria-label": "Messages" });
  const emptyHint = h("p.thread-empty", "Ask the running model something: Enter sends, Shift+Enter starts a new line.");
  // Not a named region: its name would be the conversation's title, and labels must stay unique.
  const element = h("div.thread", title, emptyHint, list);

  const items = new Map(); // message id → its <li>
  const pending = new Set();
  let renderTimer = null;

  const flush = () => {
    renderTimer = null;
    const follow = nearBottom();
    for (const m of pending) {
      const item = items.get(m.id);
      if (item && item.message === m) updateItem(item, m);
    }
    pending.clear();
    if (follow) toBottom();
  };

  const itemFor = (m, siblings, busy) => {
    const item = messageItem(m, { siblings, busy, onBranch, onEdit, onRegenerate, onToolDecision });
    item.message = m;
    items.set(m.id, item);
    return item;
  };

  return {
    element,

    render(entry, busy) {
      items.clear();
      pending.clear();
      title.textContent = entry ? entry.conversation.title : "New chat";
      if (!entry) {
        list.replaceChildren();
        emptyHint.hidden = false;
        return;
      }
      const { conversation, messages } = entry;
      const path = visiblePath(conversation, messages);
      const nodes = path.map((m) => {
        const siblings = childrenOf(messages, m.parentId).map((s) => s.id);
        const item = itemFor(m, siblings, busy);
        const partner = m.role === "assistant" ? partnerOf(messages, m.id) : null;
        if (!partner) return item;
        // Side by side: the two answers to one prompt, as two columns.
        return h("li.compare-row", h("ol.compare", { "aria-label": "Compared answers" }, item, itemFor(partner, [], busy)));
      });
      list.replaceChildren(...nodes);
      emptyHint.hidden = path.length > 0;
    },

    changed(m, now = false) {
      pending.add(m);
      if (now) {
        if (renderTimer) clearTimeout(renderTimer);
        flush();
      } else if (!renderTimer) {
        renderTimer = setTimeout(flush, RENDER_MS);
      }
    },

    setBusy(busy) {
      for (const button of list.querySelectorAll(".message-actions button")) button.disabled = busy;
    },

    setTitle(text) {
      title.textContent = text;
    },

    // Focus on a message's branch switcher (after switching branches).
    focusBranches(id) {
      const item = items.get(id);
      const button = item && (item.querySelector(".branches button:not(:disabled)"));
      if (button) button.focus();
    },

    dispose() {
      if (renderTimer) clearTimeout(renderTimer);
    },
  };
}
