// Sign-in: paste the admin token or an admin.* key. It is checked with GET /api/system before
// it is kept; kept in sessionStorage, or localStorage with "remember on this browser".
// Where the token is comes from GET /api/signin-hint (public, no secret in it; docs/auth.md,
// "Where the admin token is"): the real path of its file and `cat <path>` for a browser on the
// server's machine, a generic sentence for any other.
import { api } from "../api.js";
import { forget, remember } from "../session.js";
import { clear, copyButton, field, h, humanError } from "../ui.js";

export async function render(root, page) {
  const input = h("input", { type: "password", name: "credential", autocomplete: "off", spellcheck: "false",
    required: true, placeholder: "vu_… or the admin token" });
  const keep = h("input", { type: "checkbox", name: "remember", id: "signin-remember" });
  const error = h("p.error-text", { role: "alert", hidden: !page.reason }, page.reason || "");
  const submit = h("button.button.primary", { type: "submit" }, "Sign in");
  const where = h("div.token-where", { "aria-live": "polite" });
  const form = h("form.card.signin", { novalidate: true },
    h("h1", "vllm-use"),
    h("p.purpose", "Sign in with the admin token or an API key with an admin scope."),
    where,
    field("Admin token or key", input),
    h("label.check", keep, " Remember on this browser"),
    h("p.hint", "Without it, the credential is forgotten when this tab closes."),
    error,
    h("div.actions", submit));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = input.value.trim();
    if (!value) {
      error.hidden = false;
      error.textContent = "Paste a token or key first.";
      input.focus();
      return;
    }
    submit.disabled = true;
    error.hidden = true;
    remember(value, keep.checked);
    try {
      await api("GET", "/system");
      input.value = "";
      window.dispatchEvent(new CustomEvent("vllm-use:signed-in"));
    } catch (err) {
      forget();
      error.hidden = false;
      error.textContent = err.status === 401 || err.status === 403
        ? `Not accepted: ${humanError(err)}`
        : humanError(err);
      input.focus();
    } finally {
      submit.disabled = false;
    }
  });
  root.append(h("div.signin-wrap", form));
  input.focus();
  showWhere(where, page);
}

// Where the admin token is: the server's answer, else (an older or unreachable server) the rule.
async function showWhere(slot, page) {
  let hint;
  try {
    hint = await api("GET", "/signin-hint", undefined, { signal: page.signal });
  } catch (error) {
    if (error.name === "AbortError") return;
    hint = { local: false, message: "The admin token is in the file admin-token in the server's data directory." };
  }
  if (hint.path) {
    const command = hint.read_with;
    clear(slot,
      h("p", hint.source === "file" ? "The admin token is in the file " : "The admin token is read from ",
        h("code.token-file", hint.path), ". On this computer, read it with:"),
      h("div.token-command", h("code.token-read", command), copyButton(() => command)),
      h("p.hint", hint.message));
  } else {
    clear(slot, h("p", hint.message));
  }
}
