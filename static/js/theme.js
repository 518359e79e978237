// Theme: "system" (follow prefers-color-scheme), "light" or "dark"; the button cycles them.
const KEY = "vllm-use.theme";
const ORDER = ["system", "light", "dark"];
const LABELS = { system: "Theme: system", light: "Theme: light", dark: "Theme: dark" };
const ICONS = { system: "◐", light: "☀", dark: "☾" };

export function currentTheme() {
  const stored = localStorage.getItem(KEY);
  return stored === "light" || stored === "dark" ? stored : "system";
}

export function setTheme(theme) {
  if (theme === "system") {
    localStorage.removeItem(KEY);
    delete document.documentElement.dataset.theme;
  } else {
    localStorage.setItem(KEY, theme);
    document.documentElement.dataset.theme = theme;
  }
  const button = document.getElementById("theme-button");
  if (button) {
    button.textContent = ICONS[theme];
    button.title = LABELS[theme];
    button.setAttribute("aria-label", `${LABELS[theme]} (change)`);
  }
}

export function initTheme() {
  setTheme(currentTheme());
  document.getElementById("theme-button").addEventListener("click", () => {
    const next = ORDER[(ORDER.indexOf(currentTheme()) + 1) % ORDER.length];
    setTheme(next);
  });
}
