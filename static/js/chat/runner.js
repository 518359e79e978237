// One assistant message's generation, from the first byte to its end (docs/chat.md, Streams):
// - start(body): POST /v1/chat/completions with X-Conversation-Id = the message id;
// - resume(): GET /v1/stream?conv_id=&from=<saved offset> (after a reload, once lookup found it);
// - a connection that drops mid-stream is resumed the same way, once;
// - stop(): DELETE /v1/stream, then the fetch is aborted; the partial text is kept, `stopped`;
// - detach(): the page is left; the fetch is aborted but the message stays `streaming` (the server
//   keeps generating) so the next visit resumes it.
// The message record ({content, reasoning, offset, status, ...}, store.js) is changed in place, its
// text and offset together at each complete SSE event, and saved at most 250 ms apart and at the end.
//
// Loading on demand (docs/router.md): a request for a deployment that is not loaded is held by the
// gateway, not a byte sent, until its vLLM is ready. Meanwhile `message.loading` is true (set by
// `setLoading()` from what /v1/models says, and by a 503 `model_loading`); it ends with the first
// event of the answer. A 503 `model_loading` is asked again after its Retry-After (counted down in
// `message.retryIn`), until LOAD_WAIT_MAX_MS have passed since the message was sent or the user
// stops it. Neither field is saved: they describe this page's request, not the answer.
//
// A 401 (the key deleted or disabled) asks `onUnauthorized(err, key)` for the key that replaces it
// (chat/key.js makes one) and sends the request once more with it; nothing was generated yet.

import { readEvents } from "../http.js";
import { putMessage } from "./store.js";
import { GatewayError, applyChunk, openCompletion, openReplay, stopStream } from "./stream.js";

const SAVE_MS = 250;
const RECONNECT_MS = [500, 1500, 3000]; // after a drop: pauses before each try to reach the replay
// Waiting for a model to load: the gateway holds each request up to its --load-wait-timeout
// (600 s by default) before a 503; past this much in all the page gives up and says so.
const LOAD_WAIT_MAX_MS = 15 * 60 * 1000;
const RETRY_AFTER_S = { fallback: 5, min: 1, max: 60 }; // a Retry-After missing or out of these bounds

const stillLoading = (err) => err instanceof GatewayError && err.status === 503 && err.code === "model_loading";
const TRANSIENT = ["loading", "retryIn"]; // the message's fields that are never saved

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

  // Whether the answer has not begun yet: its request (or replay) may still wait for a load.
  get waiting() {
    return !this.ended && !this.begun;
  }

  // What /v1/models says now about the model asked for: its request waits for a load, or not.
  // Ignored once the answer has begun, and while a 503 has said so itself.
  setLoading(loading) {
    const m = this.message;
    if (!this.waiting || m.retryIn || Boolean(m.loading) === loading) return;
    m.loading = loading;
    this.onChange(m);
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
    let rekeyed = false;
    for (;;) {
      try {
        const response = await open();
        this.responded = true;
        const base = m.offset || 0;
        let outcome = null;
        // `end` counts the bytes of this response through the event: the offset to resume from.
        await readEvents(response, ({ data, end }) => {
          if (!this.begun && data !== null) { // (a comment such as a heartbeat is not the answer)
            this.begun = true;
            delete m.loading;
          }
          const result = applyChunk(m, data);
          m.offset = base + end;
          if (result) {
            outcome = result;
            return true;
          }
          this.#changed();
          return false;
        }, { keepRequest: true });
        if (replaying && !this.begun && !this.stopping && !m.content && !m.reasoning) {
          // A clean end without a single event: the session ended before the model said anything,
          // e.g. the gateway dropped a request held for a load once its page was left (reloaded).
          return this.#finish("error", `The server ended this request before ${m.model || "the model"} answered `
            + "(the page was left while it waited). Regenerate to ask again.");
        }
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
        if (!replaying && stillLoading(err) && Date.now() - m.startedAt < LOAD_WAIT_MAX_MS) {
          await this.#waitForLoad(err.retryAfter);
          continue; // asked again (an abort meanwhile ends it above, as stopped or detached)
        }
        if (err instanceof GatewayError && err.status === 401) {
          // The key was refused before anything was generated: a request (not a replay, which
          // belongs to the refused key's session) goes once more with the key that replaces it.
          const fresh = await this.onUnauthorized(err, this.key);
          if (!replaying && !rekeyed && fresh && fresh !== this.key && !this.controller.signal.aborted) {
            rekeyed = true;
            this.key = fresh;
            continue;
          }
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

  // A 503 `model_loading`: the message says "loading" and counts down to the next try, a second
  // at a time; resolves early when the runner is aborted (stop, detach, discard).
  async #waitForLoad(retryAfter) {
    const m = this.message;
    const { fallback, min, max } = RETRY_AFTER_S;
    let left = Math.min(max, Math.max(min, retryAfter ?? fallback));
    const { signal } = this.controller;
    m.loading = true;
    while (left > 0 && !signal.aborted) {
      m.retryIn = left;
      this.onChange(m);
      await new Promise((resolve) => {
        const done = () => {
          clearTimeout(timer);
          signal.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, 1000);
        signal.addEventListener("abort", done);
      });
      left -= 1;
    }
    delete m.retryIn;
    this.onChange(m);
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
    const record = { ...this.message };
    for (const field of TRANSIENT) delete record[field];
    return putMessage(record).catch((err) => this.onSaveError(err));
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
    for (const field of TRANSIENT) delete m[field];
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
