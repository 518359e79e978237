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

export function forget() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}
