// A small status probe until the console lands: shows whether the server is alive.
const el = document.getElementById("health");
fetch("/healthz", { cache: "no-store" })
  .then((r) => r.json())
  .then((body) => { el.textContent = body.status === "ok" ? "Server is up." : "Server answered oddly."; })
  .catch(() => { el.textContent = "Server is not answering."; });
