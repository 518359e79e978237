// One assistant message's generation, from the first byte to its end (docs/chat.md, Streams):
// - start(body): POST /v1/chat/completions with X-Conversation-Id = the message id;
// - resume(): GET /v1/stream?conv_id=&from=<saved offset> (after a reload, once lookup found it);
// - a connection that drops mid-stream is resumed the same way, once;
// - stop(): DELETE /v1/stream, then the fetch is aborted; the partial text is kept, `stopped`;
// - detach(): the page is left; the fetch is aborted but the message stays `streaming` (the server
//   keeps generating) so the next visit resumes it.
// The message record ({content, reasoning, offset, status, ...}, store.js) is changed in place, its
// text and offset together at each complete SSE event, and saved at most 250 ms apart and at the end.

import { readEvents } from "../http.js";
import { putMessage } from "./store.js";
import { GatewayError, applyChunk, openCompletion, openReplay, stopStream } from "./stream.js";

const SAVE_MS = 250;
const RECONNECT_MS = [500, 1500, 3000]; // after a drop: pauses before each try to reach the replay

// A fetch that failed or a body that broke off, as opposed to an answer in words.
const isDrop = (err) => (err instanceof GatewayError && err.network) || err instanceof TypeError;

export class Runner {
  constructor(message, { key, onChange, onEnd, onUnauthorized, onSaveError }) {
    this.message = message;
    this.key = key;
    this.onChange = onChange || (() => {});
    this.onEnd = onEnd || (() => {});
    this.onUnauthorized = onUnauthorized || (() => {});
    this.onSaveError = onSaveError || (() => {});
    this.controller = new AbortController();
    this.stopping = false;
    this.detached = false;
    this.ended = false;
    this.savedAt = 0;
    this.saveTimer = null;
  }

  start(body) {
    const m = this.message;
    m.startedAt = Date.now();
    m.offset = 0;
    const open = () => openCompletion({ key: this.key, conversationId: m.id, body, signal: this.controller.signal });
    return this.#run(open, false);
  }

  resume() {
    return this.#run(this.#replay, true);
  }

  #replay = () => openReplay({ key: this.key, conversationId: this.message.id, from: this.message.offset || 0,
    signal: this.controller.signal });

  // After a drop: the replay, tried a few times while the server cannot be reached at all.
  #reconnect = async () => {
    for (let i = 0; ; i += 1) {
      await new Promise((resolve) => { setTimeout(resolve, RECONNECT_MS[i]); });
      if (this.controller.signal.aborted) throw new DOMException("aborted", "AbortError");
      try {
        return await this.#replay();
      } catch (err) {
        if (!(err instanceof GatewayError && err.network) || i + 1 >= RECONNECT_MS.length) throw err;
      }
    }
  };

  // DELETE goes out and the fetch is aborted at once (our side closes the connection, the server
  // does not have to cut it); the message ends `stopped` once the DELETE is answered. A request
  // still without an answer may reach the server after the DELETE: a second DELETE follows it.
  stop() {
    if (this.ended || this.stopping) return this.stopped;
    this.stopping = true;
    this.stopped = stopStream(this.key, this.message.id).catch((err) => { this.stopFailure = err; });
    if (!this.responded) {
      this.stopped.then(() => setTimeout(() => stopStream(this.key, this.message.id).catch(() => {}), 1000));
    }
    this.controller.abort();
    return this.stopped;
  }

  detach() {
    if (this.ended) return;
    this.detached = true;
    this.controller.abort();
  }

  // The conversation is being deleted: stop the generation and save nothing more.
  async discard() {
    if (this.ended) return;
    this.discarded = true;
    this.detached = true;
    this.#clearTimer();
    this.controller.abort();
    try {
      await stopStream(this.key, this.message.id);
    } catch (_) { /* the conversation goes anyway */ }
  }

  async #run(open, replaying) {
    const m = this.message;
    let retried = false;
    for (;;) {
      try {
        const response = await open();
        this.responded = true;
        const base = m.offset || 0;
        let outcome = null;
        // `end` counts the bytes of this response through the event: the offset to resume from.
        await readEvents(response, ({ data, end }) => {
          const result = applyChunk(m, data);
          m.offset = base + end;
          if (result) {
            outcome = result;
            return true;
          }
          this.#changed();
          return false;
        }, { keepRequest: true });
        if (outcome === "done") return this.#finish("done");
        if (outcome instanceof Error) return this.#finish("error", outcome.message);
        if (this.stopping) return this.#stopped();
        if (m.finishReason) return this.#finish("done");
        throw new TypeError("the stream ended before [DONE]");
      } catch (err) {
        if (this.detached) {
          this.#clearTimer();
          if (!this.discarded) await this.#save();
          return;
        }
        if (this.stopping) return this.#stopped();
        if (err instanceof GatewayError && err.status === 401) {
          this.onUnauthorized(err);
          return this.#finish("error", err.message);
        }
        if (isDrop(err) && !retried) {
          retried = true;
          replaying = true;
          open = this.#reconnect; // the connection dropped: continue from the last complete event
          continue;
        }
        return this.#finish("error", this.#explain(err, replaying));
      }
    }
  }

  #explain(err, replaying) {
    if (replaying && err instanceof GatewayError) {
      if (err.status === 404) return "The server no longer has this stream: the answer is incomplete.";
      if (err.status === 400) return `The rest of this answer can no longer be replayed (${err.message}).`;
    }
    if (isDrop(err)) return "The connection to the server broke off: the answer is incomplete.";
    return err.message || String(err);
  }

  #changed() {
    this.onChange(this.message);
    if (this.saveTimer) return;
    const wait = Math.max(0, SAVE_MS - (Date.now() - this.savedAt));
    this.saveTimer = setTimeout(() => {
      this.saveTimer = null;
      this.#save();
    }, wait);
  }

  #clearTimer() {
    if (this.saveTimer) clearTimeout(this.saveTimer);
    this.saveTimer = null;
  }

  #save() {
    if (this.discarded) return Promise.resolve();
    this.savedAt = Date.now();
    return putMessage({ ...this.message }).catch((err) => this.onSaveError(err));
  }

  async #stopped() {
    await this.stopped;
    return this.#finish("stopped");
  }

  #finish(status, note) {
    this.finishing = this.#end(status, note);
    return this.finishing;
  }

  async #end(status, note) {
    const m = this.message;
    m.status = status;
    m.finishedAt = Date.now();
    if (status === "stopped" && this.stopFailure) {
      note = `The server was not told to stop (${this.stopFailure.message}).`;
    }
    if (note) m.note = note;
    else delete m.note;
    this.ended = true;
    this.#clearTimer();
    await this.#save();
    this.onChange(m);
    this.onEnd(this);
  }
}
