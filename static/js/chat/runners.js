// The answers streaming on the chat page: one Runner (runner.js) per assistant message, keyed by
// conversation and message. A conversation is busy while one of its answers streams; Stop stops
// the conversation's answers, deleting a conversation discards its, leaving the page detaches all
// (the server goes on generating; the next visit resumes them).
//
// `markLoading(needsLoad)`: the answers still waiting for their first event show "loading <model>…"
// where the models' listing says their model is being (or must be) loaded.
//
// `resumeStale(entries, signal)`: answers left `streaming` (a reload, another page of the console)
// are continued from their saved offset when the gateway still has them (POST /v1/streams/lookup),
// else marked `error` with their partial text kept.
//
// Callbacks: {key() (the inference key now), onChange(message), onEnd(message) (after the runner
// has left the set), onUnauthorized(err, key) (a promise of the key that replaces a refused one,
// runner.js), onSaveError(err)}.

import { Runner } from "./runner.js";
import { putMessage, streamingMessages } from "./store.js";
import { lookupStreams } from "./stream.js";

const runnerKey = (m) => `${m.conversationId}/${m.id}`;

export class Runners {
  #runners = new Map(); // runnerKey → Runner
  #resuming = false;

  constructor(callbacks) {
    this.callbacks = callbacks;
  }

  busy(conversationId) {
    for (const r of this.#runners.values()) if (r.message.conversationId === conversationId) return true;
    return false;
  }

  start(message, body) {
    this.#run(message).start(body);
  }

  resume(message) {
    this.#run(message).resume();
  }

  // Resolves once the server has been told to stop each of the conversation's answers.
  stop(conversationId) {
    const mine = [...this.#runners.values()].filter((r) => r.message.conversationId === conversationId);
    return Promise.all(mine.map((r) => r.stop()));
  }

  discard(conversationId) {
    for (const [k, r] of this.#runners) {
      if (r.message.conversationId === conversationId) {
        this.#runners.delete(k);
        r.discard();
      }
    }
  }

  // After a listing of the models: each answer not begun yet says whether its model is loading
  // (`needsLoad(name)`, chat/models.js).
  markLoading(needsLoad) {
    for (const r of this.#runners.values()) if (r.waiting) r.setLoading(needsLoad(r.message.model));
  }

  detachAll() {
    for (const r of this.#runners.values()) r.detach();
    this.#runners.clear();
  }

  // Resolves to true once the stale answers found have been resumed or marked, false when there was
  // nothing to do (none, or a look-up already running); rejects with the look-up's error.
  async resumeStale(entries, signal) {
    if (this.#resuming) return false;
    this.#resuming = true;
    try {
      const stale = (await streamingMessages()).filter((m) => !this.#runners.has(runnerKey(m)));
      if (!stale.length) return false;
      const found = await lookupStreams(this.callbacks.key(), [...new Set(stale.map((m) => m.id))], signal);
      for (const record of stale) {
        const entry = await entries.get(record.conversationId);
        const m = entry && entry.messages.get(record.id);
        if (!m || this.#runners.has(runnerKey(m)) || m.status !== "streaming") continue;
        if (found.has(m.id)) {
          this.resume(m);
        } else {
          m.status = "error";
          m.note = "The server no longer has this stream: the answer is incomplete.";
          m.finishedAt = m.finishedAt || Date.now();
          await putMessage({ ...m });
          this.callbacks.onChange(m);
        }
      }
      return true;
    } finally {
      this.#resuming = false;
    }
  }

  #run(message) {
    const { key, onChange, onEnd, onUnauthorized, onSaveError } = this.callbacks;
    const runner = new Runner(message, {
      key: key(),
      onChange,
      onEnd: (r) => {
        if (this.#runners.get(runnerKey(r.message)) === r) this.#runners.delete(runnerKey(r.message));
        onEnd(r.message);
      },
      onUnauthorized,
      onSaveError,
    });
    this.#runners.set(runnerKey(message), runner);
    return runner;
  }
}
