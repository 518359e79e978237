// Placeholder until this page is written (issue 6).
import { pageHeader } from "../ui.js";

export async function render(root) {
  root.append(pageHeader("downloads", "Not written yet."));
}
