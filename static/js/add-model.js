// The "Add model" form (docs/console.md, "Models"), on the Models page and in the Overview's first-run
// checklist: POST /api/models {source, revision?, token?, name?}. A Hugging Face repository
// (owner/name) is checked on the hub, registered and its download started at once; a directory under
// the models directory is registered as it is. The hub's answer (not found, gated, needs a token)
// shows under the field, and nothing is saved then.
//
// `addModelForm({signal, onAdded(task, model), card})`: the <form class="add-model-form"> (input
// name="source", button "Add model"); `card: false` drops its card frame and heading (the checklist).
import { api } from "./api.js";
import { clear, errorSlot, field, h, reportFailure, showError, showFieldErrors, toast } from "./ui.js";

// One form for both kinds of model; revision, token and name are under "More options". A token
// is sent once and the field is emptied as soon as the request has left.
export function addModelForm({ signal, onAdded, card = true }) {
  const source = h("input", { name: "source", required: true, autocomplete: "off", spellcheck: "false",
    autocapitalize: "off", placeholder: "acme/tiny-chat or a directory under the models directory" });
  const revision = h("input", { name: "revision", autocomplete: "off", spellcheck: "false", autocapitalize: "off",
    placeholder: "main" });
  const token = h("input", { type: "password", name: "token", autocomplete: "off", spellcheck: "false",
    autocapitalize: "off" });
  const name = h("input", { name: "name", autocomplete: "off" });
  const hint = h("span.models-dir-hint", "A Hugging Face repository (owner/name) is checked on the hub and "
    + "downloaded at once; a directory directly under the models directory is registered as it is.");
  const submit = h("button.button.primary", { type: "submit" }, "Add model");
  const error = errorSlot();
  const more = h("details.add-model-more",
    h("summary", "More options"),
    h("div.form-row",
      field("Revision", revision, "For a repository: a branch, tag or commit (default main)."),
      field("Access token", token, "For a gated or private repository: used to check it and for this "
        + "download only; never stored or logged."),
      field("Name (optional)", name, "Defaults to the repository or the directory's name.")));
  const form = h(`form.add-model-form${card ? ".card" : ""}`, { novalidate: true, "aria-label": "Add model" },
    card ? h("h2", "Add model") : null,
    field("Repository or directory", source, hint),
    more,
    h("div.actions", submit, error));
  showModelsDir(hint, signal);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { source: source.value.trim() };
    if (revision.value.trim()) body.revision = revision.value.trim();
    if (token.value.trim()) body.token = token.value.trim();
    if (name.value.trim()) body.name = name.value.trim();
    showError(error, null);
    showFieldErrors(form, null);
    if (!body.source) {
      token.value = "";
      showFieldErrors(form, { fieldErrors: { source: "Give a repository such as acme/tiny-chat, or a directory." } });
      source.focus();
      return;
    }
    submit.disabled = true;
    const request = api("POST", "/models", body, { signal });
    token.value = ""; // the request has left with it; it is not kept anywhere
    delete body.token;
    try {
      const { model, task } = await request;
      toast(task ? `Added ${model.name}; its download has started.`
        : `Added ${model.name}; it is downloaded: deploy it from its row.`, "ok");
      form.reset();
      more.open = false;
      await onAdded(task, model);
      source.focus();
    } catch (err) {
      if (err.fieldErrors && ["revision", "token", "name"].some((f) => f in err.fieldErrors)) more.open = true;
      reportFailure(form, error, err);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

// Name the models directory in the add form's hint (GET /api/system); the hint stays generic without it.
async function showModelsDir(hint, signal) {
  try {
    const { models_dir: dir } = await api("GET", "/system", undefined, { signal });
    if (dir) {
      clear(hint, "A Hugging Face repository (owner/name) is checked on the hub and downloaded at once; a "
        + "directory directly under ", h("code", dir), " (its name or absolute path) is registered as it is.");
    }
  } catch (_) {
    // only a hint
  }
}

