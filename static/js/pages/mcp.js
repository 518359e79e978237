// Placeholder until this page is written (issue 6).
import { pageHeader } from "../ui.js";

export async function render(root) {
  root.append(pageHeader("mcp", "Not written yet."));
}
