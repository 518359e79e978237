// Markdown → safe DOM for the model's answers, with marked and DOMPurify (static/vendor/, from
// `make console-libs`). docs/chat.md, Safety:
// - raw HTML in the Markdown is shown as text: the renderer escapes `html` tokens, never passes them;
// - links keep only http:, https: and mailto: targets (anything else is plain text) and get
//   rel="noopener noreferrer" target="_blank";
// - images are never loaded: their alt text and URL become a link;
// - the HTML marked makes then goes through DOMPurify (a tag/attribute allow-list) and reaches the
//   page as a DocumentFragment, so no HTML string is ever assigned to the document.
// Code blocks get a "Copy code" button, added as DOM after sanitizing.

import { Marked } from "/vendor/marked.esm.js";
import DOMPurify from "/vendor/purify.es.js";
import { h } from "../ui.js";

const SAFE_URL = /^(?:https?:|mailto:)/i;

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// An absolute http(s)/mailto URL, or null.
function safeUrl(href) {
  const raw = String(href || "").trim();
  if (!SAFE_URL.test(raw)) return null;
  try {
    const url = new URL(raw);
    return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
  } catch (_) {
    return null;
  }
}

const link = (url, inner, title) => `<a href="${escapeHtml(url)}"${title ? ` title="${escapeHtml(title)}"` : ""} `
  + `rel="noopener noreferrer" target="_blank">${inner}</a>`;

const markdown = new Marked({ gfm: true, breaks: false, async: false });
markdown.use({
  renderer: {
    // Raw HTML (blocks and inline tags) is text.
    html({ text }) {
      return escapeHtml(text);
    },
    link({ href, title, tokens }) {
      const inner = this.parser.parseInline(tokens);
      const url = safeUrl(href);
      return url ? link(url, inner, title) : inner;
    },
    image({ href, title, text }) {
      const url = safeUrl(href);
      const label = text ? `${text} (image: ${href})` : `image: ${href}`;
      return url ? link(url, escapeHtml(label), title) : escapeHtml(label);
    },
    checkbox({ checked }) {
      return checked ? "☑ " : "☐ ";
    },
  },
});

// A DOMPurify of our own (not the shared default), with a hook for links.
const purify = DOMPurify(window);
purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName !== "A") return;
  const url = safeUrl(node.getAttribute("href"));
  if (url) {
    node.setAttribute("href", url);
    node.setAttribute("rel", "noopener noreferrer");
    node.setAttribute("target", "_blank");
  } else {
    node.removeAttribute("href");
    node.removeAttribute("target");
  }
});

const PURIFY = {
  ALLOWED_TAGS: ["a", "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "s", "code",
    "pre", "blockquote", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "span", "sub", "sup"],
  ALLOWED_ATTR: ["href", "title", "rel", "target", "class", "align", "start"],
  ALLOWED_URI_REGEXP: SAFE_URL,
  RETURN_DOM_FRAGMENT: true,
};

// Copy that also works where navigator.clipboard does not exist (a console served over plain http).
// The textarea goes next to `near` (inside the chat page, whose CSS hides it off-screen).
async function copyText(text, near) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = h("textarea.offscreen", { readonly: true, "aria-hidden": "true", tabindex: "-1" });
  area.value = text;
  near.after(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  if (!ok) throw new Error("copy refused");
}

export function copyCodeButton(getText, label = "Copy code") {
  const button = h("button.button.small.copy-code", { type: "button" }, label);
  button.addEventListener("click", async () => {
    try {
      await copyText(getText(), button);
      button.textContent = "Copied";
    } catch (_) {
      button.textContent = "Select and copy";
    }
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}

// Render `text` into `target` (replacing what it held).
export function renderMarkdown(target, text) {
  const html = markdown.parse(String(text || ""));
  const fragment = purify.sanitize(html, PURIFY);
  for (const pre of fragment.querySelectorAll("pre")) {
    const code = pre.querySelector("code") || pre;
    const lang = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className || "");
    const bar = h("div.code-bar", h("span.code-lang", lang ? lang[1] : ""), copyCodeButton(() => code.textContent));
    const block = h("div.code-block");
    pre.replaceWith(block);
    block.append(bar, pre);
  }
  target.replaceChildren(fragment);
}
