// The chat's inference key (an `inference`-scoped API key for /v1), kept where the admin credential
// is kept (static/js/session.js): localStorage when the admin chose "remember", else sessionStorage,
// under `vllm-use.playground-key`. It is only ever sent in an Authorization header to /v1.

const KEY = "vllm-use.playground-key";
const CREDENTIAL = "vllm-use.credential";

export function inferenceKey() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "";
}

export function keepInferenceKey(value) {
  forgetInferenceKey();
  const remembered = Boolean(localStorage.getItem(CREDENTIAL));
  (remembered ? localStorage : sessionStorage).setItem(KEY, value);
}

export function forgetInferenceKey() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}
