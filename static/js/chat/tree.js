// A conversation's messages as a tree (store.js describes the records): each message has a parent
// (null for a first message); siblings are branches, and `conversation.selected[parent or "root"]`
// says which one is shown. A side-by-side answer (`pairOf`) is not a branch: it is shown next to the
// answer it was compared with and never has children.

export const ROOT = "root";

const parentKey = (parentId) => parentId || ROOT;
const byCreation = (a, b) => (a.createdAt || 0) - (b.createdAt || 0) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

// The branches under `parentId` (null: the first messages), oldest first.
export function childrenOf(messages, parentId) {
  const out = [];
  for (const m of messages.values()) {
    if ((m.parentId || null) === (parentId || null) && !m.pairOf) out.push(m);
  }
  return out.sort(byCreation);
}

export function partnerOf(messages, id) {
  for (const m of messages.values()) if (m.pairOf === id) return m;
  return null;
}

// The branch shown under `parentId`: the selected one, else the newest.
export function shownChild(conversation, messages, parentId) {
  const children = childrenOf(messages, parentId);
  if (!children.length) return null;
  const chosen = conversation.selected && conversation.selected[parentKey(parentId)];
  return children.find((m) => m.id === chosen) || children[children.length - 1];
}

// The messages shown, first to last, following the selected branch at each step.
export function visiblePath(conversation, messages) {
  const path = [];
  let parent = null;
  for (let guard = 0; guard <= messages.size; guard += 1) {
    const next = shownChild(conversation, messages, parent);
    if (!next) break;
    path.push(next);
    parent = next.id;
  }
  return path;
}

// From the first message down to `id` (inclusive), through the parents.
export function lineage(messages, id) {
  const path = [];
  for (let m = messages.get(id); m && path.length <= messages.size; m = m.parentId ? messages.get(m.parentId) : null) {
    path.unshift(m);
  }
  return path;
}

export function select(conversation, message) {
  conversation.selected = { ...(conversation.selected || {}), [parentKey(message.parentId)]: message.id };
}
