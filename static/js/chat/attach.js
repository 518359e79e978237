// Attachments on the page (docs/chat.md, Attachments): the composer's picker and the chips that
// show a message's attachments (chat/attachments.js reads the files and builds the request parts).
//
// `createAttachPicker({check(kind), onProblem(text)})`: a button "Attach" that opens a file input
// labelled "Attach files" (several at once), and files dropped on `dropTarget(element)`; each file is
// read (an image downscaled, a PDF's text extracted) unless `check(kind)` refuses it in words (the
// model chosen does not take that kind), and shows as a chip with "Remove <name>". `take()` hands
// the attachments over (the composer empties), `restore(list)` puts them back (a send refused),
// `list` is what is attached now, `clear()`.
//
// `modalityChecks({controls(), attached()})`: `refusal(kind)`, why the models chosen (and compared)
// cannot take an attachment of `kind`; `canChoose(name)`, why a model cannot be chosen for what is
// attached (`attached()`: the conversation's messages and the composer's, as {attachments}).
//
// `attachmentList(attachments, onRemove?)`: `ul.attachments` of `li.attachment[data-kind]`, an
// image as a thumbnail (its alt text the file's name), audio and PDF as a chip with name and size.

import { formatBytes, h } from "../ui.js";
import { kindOf, neededBy, readAttachment, refusalFor } from "./attachments.js";

const KIND_LABEL = { image: "Image", audio: "Audio", pdf: "PDF" };

export function attachmentList(attachments, onRemove = null) {
  return h("ul.attachments", { "aria-label": "Attachments" }, attachments.map((a, i) => h(
    "li.attachment", { dataset: { kind: a.kind } },
    a.kind === "image" ? h("img.attachment-thumb", { src: a.data, alt: a.name, width: 64, height: 64 }) : null,
    h("span.attachment-kind", KIND_LABEL[a.kind] || a.kind),
    h("span.attachment-name", { title: a.name }, a.name),
    h("span.attachment-size", a.kind === "pdf" ? `${a.text.length} characters` : formatBytes(a.size)),
    onRemove ? h("button.button.small.quiet", { type: "button", "aria-label": `Remove ${a.name}`, title: "Remove",
      onclick: () => onRemove(i) }, "×") : null,
  )));
}

export function modalityChecks({ controls, attached }) {
  return {
    refusal(kind) {
      const { model, compareModel } = controls().read();
      for (const name of [model, compareModel].filter(Boolean)) {
        const refusal = refusalFor(kind, controls().modalities(name), name);
        if (refusal) return refusal;
      }
      return null;
    },
    canChoose(name) {
      for (const need of neededBy(attached())) {
        const refusal = refusalFor(need, controls().modalities(name), name);
        if (refusal) {
          return `This conversation has ${need === "image" ? "images" : "audio"} attached: ${refusal} `
            + "Keep this model, or start a new chat.";
        }
      }
      return null;
    },
  };
}

export function createAttachPicker({ check, onProblem }) {
  let attached = [];
  let reading = 0;
  const input = h("input.visually-hidden", { type: "file", multiple: true, id: "chat-attach",
    accept: "image/png,image/jpeg,image/webp,image/gif,audio/wav,audio/x-wav,audio/mpeg,.wav,.mp3,application/pdf,.pdf" });
  const label = h("label.visually-hidden", { for: "chat-attach" }, "Attach files");
  const status = h("span.attach-status", { role: "status" });
  const chips = h("div.attach-chips");
  const button = h("button.button.small", { type: "button", onclick: () => input.click() }, "Attach");
  const element = h("div.attach", h("div.attach-row", button, label, input, status), chips);

  const draw = () => {
    chips.replaceChildren(attached.length ? attachmentList(attached, (i) => {
      attached.splice(i, 1);
      draw();
      button.focus();
    }) : "");
    status.textContent = reading ? "Reading…" : "";
  };

  async function add(files) {
    const problems = [];
    for (const file of files) {
      const kind = kindOf(file);
      const refusal = kind && check(kind);
      if (refusal) {
        problems.push(`${file.name}: ${refusal}`);
        continue;
      }
      reading += 1;
      draw();
      try {
        attached.push(await readAttachment(file));
      } catch (err) {
        problems.push(err.message);
      } finally {
        reading -= 1;
        draw();
      }
    }
    onProblem(problems.length ? problems.join(" ") : null);
  }

  input.addEventListener("change", () => {
    const files = [...input.files];
    input.value = ""; // the same file can be chosen again
    add(files);
  });

  return {
    element,
    get list() {
      return attached;
    },
    get busy() {
      return reading > 0;
    },
    take() {
      const taken = attached;
      attached = [];
      draw();
      return taken;
    },
    restore(list) {
      attached = [...list, ...attached];
      draw();
    },
    clear() {
      attached = [];
      draw();
    },
    // Files dropped on `target` are attached like chosen ones.
    dropTarget(target) {
      target.addEventListener("dragover", (event) => {
        if (event.dataTransfer && [...event.dataTransfer.types].includes("Files")) event.preventDefault();
      });
      target.addEventListener("drop", (event) => {
        if (!event.dataTransfer || !event.dataTransfer.files.length) return;
        event.preventDefault();
        add([...event.dataTransfer.files]);
      });
    },
  };
}
