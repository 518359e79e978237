// The tool loop of one user turn (docs/chat.md, "Tools"): an answer that ends with tool calls has
// them run, one after the other, through /tools (chat/tools.js), then the next answer is asked for
// automatically, as a child of that answer in the message tree; at most MAX_ROUNDS rounds per user
// turn (then the loop stops and says so).
//
// Each call lives in its answer's record, `message.toolCalls[i]` = {id, name, arguments, state,
// output, result, error}, saved as it changes (the output at most SAVE_MS apart), so a reload keeps
// calls, arguments and outputs so far. `state`:
//
//   (none: being written) → running → done            (a read tool; `result` is the tool message)
//                         ↘ waiting → running | denied  (a write tool waits for Allow / Deny)
//   running → failed (/tools refused: 401, 404, 429, the network; the loop stops) → running | denied
//   running, saved when the page was left → interrupted (a write tool) → running | denied;
//                                           a read tool just runs again
//   any without a result → skipped (Stop, or the round cap: `message.toolNote` says so)
//
// A call is never re-run by itself for a write tool. `message.round` counts the answers of the
// turn that came after tool results (the user's answer is round 0); `message.toolsEnded` marks an
// answer whose loop was stopped, so opening the conversation again does not resume it.
//
// `createToolLoop({entries, picker, onChange(message), onBusy(), onContinue(entry, previous, next)})`:
// `after(message)` when an answer ends; `resume(entry)` when a conversation is opened (a reload);
// `decide(message, index, choice)` from the buttons; `stop(conversationId)`; `busy(conversationId)`;
// `detachAll()` when the page is left: the calls stay as saved (running, waiting), and the next
// visit goes on from there.

import * as store from "./store.js";
import { select } from "./tree.js";

export const MAX_ROUNDS = 10;
const SAVE_MS = 250;
const DENIED = JSON.stringify({ error: "the user denied this call" });

const needsResult = (call) => call.result === undefined || call.result === null;

export function createToolLoop({ entries, picker, onChange, onBusy, onContinue }) {
  const active = new Map(); // answer id → {conversationId, controller}
  const waiters = new Map(); // "<answer id>/<index>" → resolve(choice)
  const decided = new Map(); // decisions made while no loop waited (a failed call's "Run again")
  let detached = false; // the page was left

  const save = (m) => store.putMessage({ ...m }).catch(() => {});
  const changed = (m) => {
    onChange(m);
    return save(m);
  };

  const decision = (m, index) => {
    const key = `${m.id}/${index}`;
    if (decided.has(key)) {
      const choice = decided.get(key);
      decided.delete(key);
      return Promise.resolve(choice);
    }
    return new Promise((resolve) => { waiters.set(key, resolve); });
  };

  const end = (m, note) => {
    for (const call of m.toolCalls || []) {
      if (needsResult(call)) call.state = "skipped";
    }
    m.toolNote = note;
    m.toolsEnded = true;
    return changed(m);
  };

  // Runs one call; true when it has a result, false when /tools refused it (the loop stops).
  const runCall = async (m, call, tool, signal) => {
    let params;
    try {
      params = JSON.parse(call.arguments || "{}");
    } catch (err) {
      params = null;
    }
    if (params === null || typeof params !== "object" || Array.isArray(params)) {
      call.result = JSON.stringify({ error: "the arguments are not a JSON object" });
      call.state = "done";
      await changed(m);
      return true;
    }
    call.state = "running";
    call.output = "";
    delete call.error;
    await changed(m);
    let savedAt = Date.now();
    try {
      call.result = await picker.call({ name: call.name, params, stream: Boolean(tool.stream), signal,
        onChunk: (text) => {
          call.output = text;
          onChange(m);
          if (Date.now() - savedAt >= SAVE_MS) {
            savedAt = Date.now();
            save(m);
          }
        } });
      call.state = "done";
      delete call.output;
      await changed(m);
      return true;
    } catch (err) {
      if (err.name === "AbortError") throw err;
      call.state = "failed";
      const said = String(err.message || err).replace(/[.\s]*$/, "");
      call.error = `${said}. The loop stopped: run the call again, or deny it.`;
      await changed(m);
      return false;
    }
  };

  const run = async (entry, m) => {
    if (active.has(m.id) || detached) return;
    const controller = new AbortController();
    active.set(m.id, { conversationId: m.conversationId, controller });
    onBusy();
    try {
      const tools = entry.conversation.tools || [];
      await picker.ready();
      if ((m.round || 0) >= MAX_ROUNDS) {
        await end(m, `Stopped after ${MAX_ROUNDS} rounds of tool calls in one turn: these calls were not run. `
          + "Send a message to go on.");
        return;
      }
      for (const [index, call] of m.toolCalls.entries()) {
        if (!needsResult(call)) continue;
        const tool = tools.includes(call.name) ? picker.find(call.name) : null;
        if (!tool) {
          call.result = JSON.stringify({ error: `no tool named ${call.name} is enabled in this chat` });
          call.state = "done";
          await changed(m);
          continue;
        }
        const write = Boolean(tool.permissions && tool.permissions.write);
        if (call.state === "running") call.state = write ? "interrupted" : undefined; // left mid-call
        if (write && !call.state) call.state = "waiting";
        if (["waiting", "interrupted", "failed"].includes(call.state)) {
          await changed(m);
          const choice = await decision(m, index);
          if (choice === "detach") return;
          if (choice === "stop") {
            await end(m, "Stopped: the remaining tool calls were not run.");
            return;
          }
          if (choice === "deny") {
            call.result = DENIED;
            call.state = "denied";
            delete call.error;
            await changed(m);
            continue;
          }
        }
        if (!(await runCall(m, call, tool, controller.signal))) return;
      }
      // Every call has its result: the next answer, with them.
      const next = entries.newMessage(entry, { role: "assistant", parentId: m.id, model: m.model || null,
        status: "streaming", startedAt: Date.now(), round: (m.round || 0) + 1 });
      select(entry.conversation, next);
      entry.conversation.updatedAt = Date.now();
      await store.putConversation(entry.conversation, [{ ...m }, next]);
      onContinue(entry, m, next);
    } catch (err) {
      if (err.name !== "AbortError") throw err;
      if (!detached) await end(m, "Stopped: the remaining tool calls were not run.");
    } finally {
      active.delete(m.id);
      for (const key of [...waiters.keys()]) if (key.startsWith(`${m.id}/`)) waiters.delete(key);
      onBusy();
    }
  };

  // An answer of `entry` whose calls still wait for their results and whose loop was not stopped.
  const pending = (entry, m) => m.role === "assistant" && m.status === "done" && !m.toolsEnded
    && Array.isArray(m.toolCalls) && m.toolCalls.length > 0
    && ![...entry.messages.values()].some((c) => c.parentId === m.id);

  return {
    async after(m) {
      if (detached) return;
      const entry = await entries.get(m.conversationId);
      if (entry && pending(entry, m)) await run(entry, m);
    },

    resume(entry) {
      for (const m of entry.messages.values()) if (pending(entry, m)) run(entry, m);
    },

    decide(m, index, choice) {
      const key = `${m.id}/${index}`;
      const waiter = waiters.get(key);
      if (waiter) {
        waiters.delete(key);
        waiter(choice);
        return;
      }
      // No loop waits (a failed call, the loop having stopped): the choice starts it again.
      decided.set(key, choice);
      entries.get(m.conversationId).then((entry) => { if (entry && pending(entry, m)) run(entry, m); });
    },

    stop(conversationId) {
      for (const [id, job] of active) {
        if (job.conversationId !== conversationId) continue;
        job.controller.abort();
        for (const [key, resolve] of waiters) if (key.startsWith(`${id}/`)) resolve("stop");
      }
    },

    detachAll() {
      detached = true;
      for (const job of active.values()) job.controller.abort();
      for (const resolve of waiters.values()) resolve("detach");
    },

    busy(conversationId) {
      for (const job of active.values()) if (job.conversationId === conversationId) return true;
      return false;
    },
  };
}
