// Attachments of a prompt (docs/chat.md, Attachments), read in the browser and kept with the user
// message (store.js): `attachments: [{kind, name, mime, size, data | text}]`.
//
// - image: downscaled on a canvas so that its longer side is at most IMAGE_MAX_SIDE px, re-encoded
//   (PNG, or JPEG for a JPEG or WebP; the file's metadata stays behind), `data` a data: URI; sent as
//   an `image_url` part. Needs a model that takes "image".
// - audio (WAV or MP3): `data` the file's bytes in base64, `format` "wav" or "mp3"; sent as an
//   `input_audio` part. Needs a model that takes "audio".
// - pdf: its text, extracted with pdf.js (static/vendor/pdf.js and its worker, loaded on first
//   use); sent as a text part "[PDF name.pdf]\n…". Any model takes it.
//
// The request body is checked before it is sent: at most BODY_MAX_BYTES (the gateway's cap on
// /v1, handlers/gateway.py), else the page says so and sends nothing.

export const BODY_MAX_BYTES = 16 * 1024 * 1024;
export const FILE_MAX_BYTES = 64 * 1024 * 1024; // a file larger than this is not read at all
export const IMAGE_MAX_SIDE = 2048;
const MiB = 1024 * 1024;

const AUDIO = { wav: ["audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"], mp3: ["audio/mpeg", "audio/mp3"] };
// The modality a kind needs from the model (GET /v1/models `input_modalities`); a PDF's text needs none.
export const NEEDS = { image: "image", audio: "audio", pdf: null };
const KIND_WORDS = { image: "images", audio: "audio" };

const extension = (name) => (name.match(/\.([a-z0-9]+)$/i) || ["", ""])[1].toLowerCase();

// "image", "audio", "pdf", or null for a file the chat cannot attach.
export function kindOf(file) {
  const type = (file.type || "").toLowerCase();
  const ext = extension(file.name || "");
  if (["image/png", "image/jpeg", "image/webp", "image/gif"].includes(type)
      || ["png", "jpg", "jpeg", "webp", "gif"].includes(ext)) return "image";
  if (audioFormat(type, ext)) return "audio";
  if (type === "application/pdf" || ext === "pdf") return "pdf";
  return null;
}

function audioFormat(type, ext) {
  for (const [format, types] of Object.entries(AUDIO)) {
    if (types.includes(type) || ext === format) return format;
  }
  return null;
}

// Why `model` (taking `modalities`) cannot have attachments of `kind`; null when it can.
export function refusalFor(kind, modalities, model) {
  const need = NEEDS[kind];
  if (!need || modalities.includes(need)) return null;
  return `${model} does not take ${KIND_WORDS[kind]} (GET /v1/models lists its inputs as ${modalities.join(", ")}).`;
}

// The modalities a conversation's attachments need ("image", "audio").
export function neededBy(messages) {
  const needed = new Set();
  for (const m of messages) {
    for (const a of m.attachments || []) if (NEEDS[a.kind]) needed.add(NEEDS[a.kind]);
  }
  return needed;
}

const asDataUrl = (blob) => new Promise((resolve, reject) => {
  const reader = new FileReader();
  reader.onload = () => resolve(reader.result);
  reader.onerror = () => reject(reader.error || new Error("the file could not be read"));
  reader.readAsDataURL(blob);
});

async function readImage(file) {
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch (_) {
    throw new Error(`${file.name} is not an image this browser can read.`);
  }
  const scale = Math.min(1, IMAGE_MAX_SIDE / Math.max(bitmap.width, bitmap.height));
  const width = Math.max(1, Math.round(bitmap.width * scale));
  const height = Math.max(1, Math.round(bitmap.height * scale));
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  canvas.getContext("2d").drawImage(bitmap, 0, 0, width, height);
  bitmap.close();
  const mime = ["image/jpeg", "image/webp"].includes(file.type) ? "image/jpeg" : "image/png";
  const blob = await new Promise((resolve) => { canvas.toBlob(resolve, mime, 0.9); });
  if (!blob) throw new Error(`${file.name} could not be re-encoded.`);
  const data = await asDataUrl(blob);
  return { kind: "image", name: file.name, mime, size: blob.size, width, height, data };
}

async function readAudio(file) {
  const format = audioFormat((file.type || "").toLowerCase(), extension(file.name || ""));
  const url = await asDataUrl(file);
  const data = url.slice(url.indexOf(",") + 1);
  return { kind: "audio", name: file.name, mime: format === "wav" ? "audio/wav" : "audio/mpeg", size: file.size,
    format, data };
}

// pdf.js, loaded on first use; its worker is a module under /vendor (script-src 'self').
let pdfjs = null;
async function pdfLibrary() {
  if (!pdfjs) {
    pdfjs = import("/vendor/pdf.js").then((lib) => {
      lib.GlobalWorkerOptions.workerSrc = "/vendor/pdf.worker.js";
      return lib;
    });
    pdfjs.catch(() => { pdfjs = null; });
  }
  return pdfjs;
}

async function readPdf(file) {
  const lib = await pdfLibrary();
  let doc;
  try {
    // No eval (the page's CSP forbids it) and no fetches of fonts: only the text is wanted.
    doc = await lib.getDocument({ data: new Uint8Array(await file.arrayBuffer()), isEvalSupported: false,
      disableFontFace: true, useSystemFonts: false, verbosity: 0 }).promise;
  } catch (err) {
    throw new Error(`${file.name} could not be read as a PDF (${err.message}).`);
  }
  const pages = [];
  try {
    for (let n = 1; n <= doc.numPages; n += 1) {
      const page = await doc.getPage(n);
      const content = await page.getTextContent();
      pages.push(content.items.map((item) => (item.str || "") + (item.hasEOL ? "\n" : "")).join("").trim());
    }
  } finally {
    doc.destroy();
  }
  const text = pages.filter(Boolean).join("\n\n");
  if (!text) throw new Error(`${file.name} has no text to extract (a scanned PDF?).`);
  return { kind: "pdf", name: file.name, mime: "application/pdf", size: file.size, text };
}

// The attachment record of `file`; throws an Error saying in words what is wrong.
export async function readAttachment(file) {
  const kind = kindOf(file);
  if (!kind) throw new Error(`${file.name} cannot be attached: images, WAV or MP3 audio and PDF files can.`);
  if (file.size > FILE_MAX_BYTES) throw new Error(`${file.name} is larger than ${FILE_MAX_BYTES / MiB} MiB.`);
  if (kind === "image") return readImage(file);
  if (kind === "audio") return readAudio(file);
  return readPdf(file);
}

// A user message's content as sent: its text alone, or content parts with its attachments.
export function contentOf(message) {
  const attachments = message.attachments || [];
  if (!attachments.length) return message.content;
  const parts = message.content ? [{ type: "text", text: message.content }] : [];
  for (const a of attachments) {
    if (a.kind === "image") parts.push({ type: "image_url", image_url: { url: a.data } });
    else if (a.kind === "audio") parts.push({ type: "input_audio", input_audio: { data: a.data, format: a.format } });
    else if (a.kind === "pdf") parts.push({ type: "text", text: `[PDF ${a.name}]\n${a.text}` });
  }
  return parts;
}

// The bytes of a completion request as the page sends it (chat/stream.js adds `stream`).
export function bodyBytes(body) {
  return new TextEncoder().encode(JSON.stringify({ ...body, stream: true })).length;
}

export function tooLargeText(bytes) {
  return `This message would be a request of ${(bytes / MiB).toFixed(2)} MiB (${bytes} bytes): the gateway takes `
    + `at most 16 MiB (${BODY_MAX_BYTES} bytes). Remove an attachment or shorten the conversation; nothing was sent.`;
}

// What is wrong with an imported attachment, in words; null when nothing is.
export function attachmentProblem(a) {
  if (a === null || typeof a !== "object" || Array.isArray(a)) return "should be an object";
  if (!Object.hasOwn(NEEDS, a.kind)) return `.kind should be one of ${Object.keys(NEEDS).join(", ")}`;
  if (typeof a.name !== "string" || !a.name || a.name.length > 255) return ".name should be 1-255 characters";
  if (typeof a.mime !== "string" || typeof a.size !== "number" || !(a.size >= 0)) return ".mime and .size are missing";
  if (a.kind === "image" && !(typeof a.data === "string" && /^data:image\/(png|jpeg);base64,[A-Za-z0-9+/=]*$/.test(a.data))) {
    return ".data should be a data:image/png or data:image/jpeg base64 URI";
  }
  if (a.kind === "audio" && !(typeof a.data === "string" && /^[A-Za-z0-9+/=]*$/.test(a.data)
      && Object.hasOwn(AUDIO, a.format))) return ".data should be base64 and .format wav or mp3";
  if (a.kind === "pdf" && typeof a.text !== "string") return ".text should be text";
  return null;
}
