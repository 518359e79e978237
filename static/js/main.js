// The console's shell: sign-in gate, navigation, client-side routes, page lifecycle.
//
// Each page is a module in js/pages/ exporting `render(root, page)`: it fills `root` and may
// push functions onto `page.cleanup` (timers, event streams) and pass `page.signal` to fetches;
// both are run/aborted when the user leaves the page. Routes are the table below; a route with a
// `parent` is not in the navigation, which marks its parent while it is shown. The top bar's
// "vLLM: …" is status.js's, followed while signed in.
//
// Page-scoped CSS (docs/console.md): while a page is shown, <body> carries `data-page="<name>"`,
// the name of its module (pages/keys.js → "keys"), and every selector in css/pages/<name>.css
// starts with `[data-page="<name>"]`, so one page's rules never style another page. It is the
// body, not <main>, because pages also append dialogs and helpers to the body.
//
// Tables on narrow screens (docs/console.md): console.css shows each row of a `.table-wrap > table`
// as a card under 720 px, each cell under its column's name; the names come from here: every
// cell of such a table gets `data-label`, its column header's text, as pages build and update rows.

import { credential, forget } from "./session.js";
import { followStatus, stopStatus } from "./status.js";
import { initTheme } from "./theme.js";
import { clear, h, humanError } from "./ui.js";

const ROUTES = [
  { path: "/", title: "Overview", module: "./pages/overview.js" },
  { path: "/models", title: "Models", module: "./pages/models.js" },
  { path: "/downloads", title: "Downloads", module: "./pages/downloads.js" },
  { path: "/deployments", title: "Deployments", module: "./pages/deployments.js" },
  // One model alone (runtime.switch, or runtime.start of a path): linked from the deployments page.
  { path: "/runtime", title: "Runtime", module: "./pages/runtime.js", parent: "/deployments" },
  { path: "/chat", title: "Chat", module: "./pages/chat.js" },
  { path: "/keys", title: "API keys", module: "./pages/keys.js" },
  { path: "/requests", title: "Requests", module: "./pages/requests.js" },
  { path: "/usage", title: "Usage", module: "./pages/usage.js" },
  { path: "/settings", title: "Settings", module: "./pages/settings.js" },
  { path: "/mcp-setup", title: "MCP", module: "./pages/mcp.js" },
];
const SIGNIN = { path: "/signin", title: "Sign in", module: "./pages/signin.js" };

const root = document.getElementById("page");
const nav = document.getElementById("nav");
const topbar = document.getElementById("topbar");
const menuButton = document.getElementById("menu-button");
let current = null; // { cleanup: [], controller }
let signinReason = "";

// The page's name: its module's file name (the CSS scope, see the header).
function pageName(route) {
  return route.module.replace(/^.*\//, "").replace(/\.js$/, "");
}

function routeFor(pathname) {
  if (!credential()) return SIGNIN;
  return ROUTES.find((r) => r.path === pathname) || (pathname === "/signin" ? ROUTES[0] : null);
}

function buildNav() {
  const shown = ROUTES.filter((r) => !r.parent);
  clear(nav, h("ul", shown.map((r) => h("li", h("a", { href: r.path, "data-route": r.path }, r.title)))));
}

// The route's own link is the current page; a route without one (the runtime) marks its parent's.
function markNav(route) {
  for (const link of nav.querySelectorAll("a")) {
    if (route && link.dataset.route === route.path) link.setAttribute("aria-current", "page");
    else if (route && link.dataset.route === route.parent) link.setAttribute("aria-current", "true");
    else link.removeAttribute("aria-current");
  }
}

// `target` is a path, possibly with a query string (/downloads?model=…), which pages read from location.
export async function show(target, { replace = false, push = true } = {}) {
  const url = new URL(target, location.origin);
  const pathname = url.pathname;
  if (current) {
    for (const fn of current.cleanup) {
      try { fn(); } catch (_) { /* a page's cleanup must not block leaving it */ }
    }
    current.controller.abort();
  }
  const route = routeFor(pathname);
  const signedIn = route !== SIGNIN;
  topbar.hidden = !signedIn;
  nav.hidden = !signedIn;
  const wanted = route ? route.path + (route === SIGNIN ? "" : url.search) : pathname + url.search;
  if (push && location.pathname + location.search !== wanted) {
    history[replace ? "replaceState" : "pushState"]({}, "", wanted);
  }
  document.title = route ? `${route.title} · vllm-use` : "Not found · vllm-use";
  markNav(route);
  closeMenu();
  const controller = new AbortController();
  const page = { cleanup: [], controller, signal: controller.signal, reason: signinReason };
  current = page;
  if (!route) {
    document.body.dataset.page = "not-found";
    clear(root, h("header.page-header", h("h1", "Page not found")),
      h("p", "There is no page at this address. ", h("a", { href: "/" }, "Go to the overview.")));
    return;
  }
  try {
    const module = await import(route.module);
    if (current !== page) return; // the user moved on while the module loaded
    document.body.dataset.page = pageName(route);
    clear(root);
    await module.render(root, page);
  } catch (error) {
    if (error && error.name === "AbortError") return;
    if (current !== page) return;
    if (error && error.status === 401) return; // the sign-in page is on its way
    document.body.dataset.page = pageName(route);
    clear(root, h("header.page-header", h("h1", route.title)),
      h("p.error-text", { role: "alert" }, `This page could not be shown: ${humanError(error)}`));
  }
  if (signedIn) root.focus({ preventScroll: true });
}

// The header of each column, by index (a colspan counts for its columns): its text, or "" when the
// header is only for screen readers (a `.visually-hidden` label, e.g. of a buttons' column).
function columnLabels(table) {
  const labels = [];
  const head = table.querySelector(":scope > thead > tr");
  for (const th of head ? head.cells : []) {
    const text = th.querySelector(".visually-hidden") ? "" : th.textContent.trim();
    for (let i = 0; i < th.colSpan; i += 1) labels.push(text);
  }
  return labels;
}

function labelCells(table) {
  const labels = columnLabels(table);
  for (const body of table.tBodies) {
    for (const tr of body.rows) {
      let column = 0;
      for (const cell of tr.cells) {
        const label = cell.colSpan === 1 ? labels[column] || "" : "";
        if (label && cell.dataset.label !== label) cell.dataset.label = label;
        else if (!label && cell.hasAttribute("data-label")) cell.removeAttribute("data-label");
        column += cell.colSpan;
      }
    }
  }
}

const TABLES = ".table-wrap > table";
new MutationObserver((records) => {
  const tables = new Set();
  for (const record of records) {
    const inside = record.target.closest && record.target.closest(TABLES);
    if (inside) tables.add(inside);
    for (const node of record.addedNodes) {
      if (node.nodeType !== Node.ELEMENT_NODE) continue;
      if (node.matches(TABLES)) tables.add(node);
      for (const table of node.querySelectorAll(TABLES)) tables.add(table);
    }
  }
  tables.forEach(labelCells);
}).observe(root, { childList: true, subtree: true });

function closeMenu() {
  document.body.classList.remove("menu-open");
  menuButton.setAttribute("aria-expanded", "false");
}

function signOut(reason = "") {
  stopStatus();
  forget();
  signinReason = reason;
  show("/signin", { replace: true });
}

// Every page calls the API; a 401 from any of them lands here.
window.addEventListener("vllm-use:unauthenticated", (event) => {
  if (!credential() || location.pathname === "/signin") return; // the sign-in page says it itself
  signOut(`You were signed out: ${event.detail || "the credential is no longer accepted"}.`);
});

// Internal links navigate without a reload.
document.addEventListener("click", (event) => {
  const link = event.target.closest("a[href]");
  if (!link || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
  const url = new URL(link.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith("/api") || link.target || link.hasAttribute("download")) return;
  event.preventDefault();
  show(url.pathname + url.search);
});

window.addEventListener("popstate", () => show(location.pathname + location.search, { push: false }));

menuButton.addEventListener("click", () => {
  const open = !document.body.classList.contains("menu-open");
  document.body.classList.toggle("menu-open", open);
  menuButton.setAttribute("aria-expanded", String(open));
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") closeMenu();
});

document.getElementById("signout-button").addEventListener("click", () => signOut("You signed out."));

// Called by the sign-in page once a credential works.
window.addEventListener("vllm-use:signed-in", () => {
  signinReason = "";
  const wanted = sessionStorage.getItem("vllm-use.after-signin") || "/";
  sessionStorage.removeItem("vllm-use.after-signin");
  const known = ROUTES.some((r) => r.path === new URL(wanted, location.origin).pathname);
  show(known ? wanted : "/", { replace: true });
  followStatus();
});

initTheme();
buildNav();
if (!credential() && location.pathname !== "/signin") {
  sessionStorage.setItem("vllm-use.after-signin", location.pathname + location.search);
}
show(location.pathname + location.search, { replace: true });
followStatus();
