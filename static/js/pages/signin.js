// Sign-in: paste the admin token or an admin.* key. It is checked with GET /api/system before
// it is kept; kept in sessionStorage, or localStorage with "remember on this browser".
import { api } from "../api.js";
import { forget, remember } from "../session.js";
import { field, h, humanError } from "../ui.js";

export async function render(root, page) {
  const input = h("input", { type: "password", name: "credential", autocomplete: "off", spellcheck: "false",
    required: true, placeholder: "vu_… or the admin token" });
  const keep = h("input", { type: "checkbox", name: "remember", id: "signin-remember" });
  const error = h("p.error-text", { role: "alert", hidden: !page.reason }, page.reason || "");
  const submit = h("button.button.primary", { type: "submit" }, "Sign in");
  const form = h("form.card.signin", { novalidate: true },
    h("h1", "vllm-use"),
    h("p.purpose", "Sign in with the admin token (VLLM_USE_ADMIN_TOKEN) or an API key with an admin scope."),
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
}
