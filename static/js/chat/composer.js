// The composer (docs/chat.md, Composer): a textarea "Message" and "Send" (Enter sends, Shift+Enter
// starts a new line); while an answer streams, "Stop" instead of an enabled Send. What went wrong
// with sending shows beside them (`error`, an errorSlot).
//
// `createComposer({onSend(), onStop(), extra})` (`extra`: shown under the textarea, the attachments): `element`, `input`, `error`; `update(busy, blocked)`
// shows Stop while busy and disables Send while busy or blocked (no model to send to yet).

import { errorSlot, field, h } from "../ui.js";

export function createComposer({ onSend, onStop, extra = null }) {
  const input = h("textarea.composer-input", { name: "message", rows: 3, placeholder: "Message the model…" });
  const send = h("button.button.primary", { type: "submit" }, "Send");
  const stop = h("button.button.danger", { type: "button", hidden: true, onclick: async () => {
    stop.disabled = true;
    await onStop();
    input.focus();
  } }, "Stop");
  const error = errorSlot();
  const form = h("form.composer", { novalidate: true },
    field("Message", input),
    extra,
    h("div.composer-row", error, h("div.actions", stop, send)));

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    onSend();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey) {
      event.preventDefault();
      if (!send.disabled) form.requestSubmit();
    }
  });

  return {
    element: form,
    input,
    error,
    update(busy, blocked) {
      send.disabled = busy || blocked;
      stop.hidden = !busy;
      stop.disabled = false;
    },
  };
}
