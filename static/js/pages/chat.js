// Placeholder until the chat page is written (issue 7).
import { pageHeader } from "../ui.js";

export async function render(root) {
  root.append(pageHeader("Chat", "Not written yet."));
}
