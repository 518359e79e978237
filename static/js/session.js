// The admin credential (the admin token or an `admin.*` key), kept in sessionStorage by default;
// "remember me" keeps it in localStorage instead. It is only ever sent in an Authorization header.

const KEY = "vllm-use.credential";

export function credential() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "";
}

export function remember(value, persistent) {
  forget();
  (persistent ? localStorage : sessionStorage).setItem(KEY, value);
}

// Signing out forgets the admin credential and the chat's keys kept beside it (chat/key.js: the
// playground key and the tool key).
export function forget() {
  for (const key of [KEY, "vllm-use.playground-key", "vllm-use.chat-tools-key"]) {
    sessionStorage.removeItem(key);
    localStorage.removeItem(key);
  }
}
