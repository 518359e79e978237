// The "Conversations" region (docs/chat.md): "New chat", "Search conversations" (by title), one
// `li[data-conversation-id]` per conversation (its title selects it; "Rename <title>" opens an
// input "Title" with "Save"; "Delete <title>" asks first), "Export" (the current conversation as
// `<title>.json`) and a file input "Import conversation". On a narrow screen the list folds away
// above the messages ("Show list" / "Hide list").
//
// The page owns the data: it calls `show(conversations, currentId)` and gets the user's choices
// through the callbacks {onNew, onSelect(id), onRename(id, title), onDelete(id), onExport(), onImport(file)}.

import { confirmDialog, empty, errorSlot, field, h, showError } from "../ui.js";

export function createSidebar(callbacks) {
  const search = h("input", { type: "search", name: "search", autocomplete: "off", placeholder: "Title contains…" });
  const list = h("ul.conversation-list");
  const listError = errorSlot();
  const toggle = h("button.button.small.list-toggle", { type: "button", "aria-expanded": "true",
    "aria-controls": "chat-conversation-body" }, "Hide list");
  const exportButton = h("button.button.small", { type: "button", disabled: true, onclick: () => callbacks.onExport() }, "Export");
  const file = h("input.import-file", { type: "file", name: "import", accept: ".json,application/json" });
  const ioError = errorSlot();
  const body = h("div#chat-conversation-body.conversation-body",
    field("Search conversations", search),
    listError,
    list,
    h("div.conversation-io", exportButton, field("Import conversation", file), ioError));
  const region = h("section.chat-sidebar", { "aria-labelledby": "chat-conversations" },
    h("div.sidebar-head",
      h("h2#chat-conversations", "Conversations"),
      h("div.actions", toggle, h("button.button.primary.small", { type: "button", onclick: () => callbacks.onNew() }, "New chat"))),
    body);

  let all = [];
  let currentId = null;

  const setCollapsed = (collapsed) => {
    region.classList.toggle("collapsed", collapsed);
    toggle.setAttribute("aria-expanded", String(!collapsed));
    toggle.textContent = collapsed ? "Show list" : "Hide list";
  };
  toggle.addEventListener("click", () => setCollapsed(!region.classList.contains("collapsed")));

  file.addEventListener("change", async () => {
    const chosen = file.files && file.files[0];
    showError(ioError, null);
    if (!chosen) return;
    try {
      await callbacks.onImport(chosen);
    } catch (err) {
      showError(ioError, err);
    } finally {
      file.value = "";
    }
  });

  const row = (conversation) => {
    const title = conversation.title || "Untitled";
    const item = h("li", { dataset: { conversationId: conversation.id } });
    const pick = h("button.conversation-title", { type: "button", title,
      "aria-current": conversation.id === currentId ? "true" : null,
      onclick: () => callbacks.onSelect(conversation.id) }, title);
    const rename = h("button.button.small.quiet", { type: "button", "aria-label": `Rename ${title}`, title: "Rename",
      onclick: () => startRename(item, conversation) }, "Rename");
    const remove = h("button.button.small.quiet.danger-text", { type: "button", "aria-label": `Delete ${title}`,
      title: "Delete", onclick: () => askDelete(conversation, remove) }, "Delete");
    item.append(pick, h("div.conversation-actions", rename, remove));
    return item;
  };

  const startRename = (item, conversation) => {
    const input = h("input", { type: "text", name: "title", value: conversation.title || "", autocomplete: "off",
      maxlength: "200" });
    const error = errorSlot();
    const cancel = () => render();
    const form = h("form.rename-form", { novalidate: true },
      field("Title", input),
      h("div.actions",
        h("button.button.small.primary", { type: "submit" }, "Save"),
        h("button.button.small", { type: "button", onclick: cancel }, "Cancel")),
      error);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const title = input.value.trim();
      if (!title) {
        showError(error, "Give it a title.");
        input.focus();
        return;
      }
      try {
        await callbacks.onRename(conversation.id, title);
        const again = list.querySelector(`li[data-conversation-id="${CSS.escape(conversation.id)}"] .conversation-title`);
        if (again) again.focus();
      } catch (err) {
        showError(error, err);
      }
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        cancel();
        const again = list.querySelector(`li[data-conversation-id="${CSS.escape(conversation.id)}"] .conversation-title`);
        if (again) again.focus();
      }
    });
    item.replaceChildren(form);
    input.focus();
    input.select();
  };

  const askDelete = async (conversation, button) => {
    const title = conversation.title || "Untitled";
    const ok = await confirmDialog(`Delete “${title}”?`,
      "Its messages and branches are removed from this browser. This cannot be undone.", "Delete");
    if (!ok) {
      button.focus();
      return;
    }
    try {
      await callbacks.onDelete(conversation.id);
      search.focus();
    } catch (err) {
      showError(listError, err);
    }
  };

  const render = () => {
    const needle = search.value.trim().toLowerCase();
    const shown = needle ? all.filter((c) => (c.title || "").toLowerCase().includes(needle)) : all;
    if (!all.length) list.replaceChildren(h("li.list-empty", empty("No conversations yet: type a message to start one.")));
    else if (!shown.length) list.replaceChildren(h("li.list-empty", empty("No conversation has that in its title.")));
    else list.replaceChildren(...shown.map(row));
    exportButton.disabled = !all.some((c) => c.id === currentId);
  };
  search.addEventListener("input", render);

  return {
    element: region,
    show(conversations, id) {
      all = conversations;
      currentId = id;
      render();
    },
    setCollapsed,
    error(err) {
      showError(listError, err);
    },
  };
}
