// Runs before first paint (a classic script, not a module), so a dark-theme user never sees a
// white flash. The choice is made in js/theme.js; "system" (no value) follows the OS.
try {
  const theme = localStorage.getItem("vllm-use.theme");
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
} catch (_) {
  // storage disabled: follow the system
}
