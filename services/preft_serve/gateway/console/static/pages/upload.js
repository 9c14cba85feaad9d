// Upload an adapter: a PEFT or ReFT folder's files, or one archive, dropped or chosen,
// sent as the SDK sends them (multipart) with progress; the registry's refusal is shown
// next to the files it is about.

import * as api from "../api.js";
import { h, fill, field, notices } from "../dom.js";

export function render(view) {
  let chosen = [];
  const note = notices();
  const name = h("input", { name: "adapter-name", required: true, autocomplete: "off", maxlength: "128" });
  // A new version keeps its adapter's mode unless another is chosen: the registry keeps
  // it when the form names none, and a PreFT adapter must not turn all-token by default.
  const keep = h("option", { value: "", hidden: true, disabled: true }, "keep the adapter's mode");
  const mode = h(
    "select",
    { name: "mode" },
    [
      keep,
      h("option", { value: "all", selected: true }, "all tokens (all)"),
      h("option", { value: "prefill" }, "the prompt only (prefill)"),
    ],
  );
  const next = h("input", { type: "checkbox", name: "new-version" });
  next.addEventListener("change", () => {
    keep.hidden = keep.disabled = !next.checked;
    if (next.checked) mode.value = "";
    else if (!mode.value) mode.value = "all";
  });
  const promote = h("input", { type: "checkbox", name: "promote" });
  const picker = h("input", { type: "file", name: "files", multiple: true });
  const folder = h("input", { type: "file", name: "folder", webkitdirectory: "" });
  const files = h("ul", { class: "files", "aria-label": "Chosen files" });
  const fileError = h("p", { class: "error", role: "alert", id: "file-error" });
  const progress = h("progress", { max: "100", value: "0", hidden: true, "aria-label": "Upload progress" });
  const drop = h(
    "div",
    { class: "drop", tabindex: "0", role: "group", "aria-label": "Drop files here" },
    "Drop adapter files (adapter_config.json and its weights) or one .tar.gz / .zip archive here, or choose them:",
    h("div", { class: "row" }, field("Files", picker), field("A folder", folder)),
    files,
    fileError,
  );
  const send = h("button", { type: "submit" }, "Upload");
  const form = h(
    "form",
    { "aria-label": "Upload an adapter" },
    h("div", { class: "row" }, field("Adapter name", name), field("Mode", mode)),
    h(
      "div",
      { class: "row" },
      field("Add a version to an existing adapter", next, "inline"),
      field("Serve it at once (promote)", promote, "inline"),
    ),
    drop,
    h("div", { class: "row" }, send, progress),
    ...note.nodes,
  );

  function choose(list) {
    chosen = Array.from(list).filter((file) => file.size >= 0);
    fileError.textContent = "";
    fill(files, chosen.map((file) => h("li", {}, `${file.name} (${file.size} bytes)`)));
  }
  picker.addEventListener("change", () => choose(picker.files));
  folder.addEventListener("change", () => choose(folder.files));
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    choose(event.dataTransfer.files);
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    note.clear();
    fileError.textContent = "";
    if (!chosen.length) {
      fileError.textContent = "Choose the adapter's files or an archive first.";
      return;
    }
    const body = new FormData();
    if (mode.value) body.set("mode", mode.value);
    for (const file of chosen) body.append("files", file, file.name);
    const adapter = name.value.trim();
    let method = "POST";
    let path = "/v1/adapters";
    if (next.checked) {
      method = "PUT";
      path = api.url(`/v1/adapters/${encodeURIComponent(adapter)}`, { promote: promote.checked ? "true" : "" });
    } else {
      body.set("name", adapter);
    }
    send.disabled = true;
    progress.hidden = false;
    progress.value = 0;
    try {
      const stored = await api.upload(method, path, body, (loaded, total) => {
        progress.value = Math.round((100 * loaded) / total);
      });
      progress.value = 100;
      note.say(`Stored ${stored.name} version ${stored.version} (${stored.type}, rank ${stored.rank}).`);
      fill(
        files,
        h("li", {}, h("a", { href: `#/adapters/${encodeURIComponent(stored.name)}` }, `Open ${stored.name}`)),
      );
      chosen = [];
    } catch (error) {
      // The registry's message names the file or field at fault: shown by the files.
      fileError.textContent = error.message;
    } finally {
      send.disabled = false;
    }
  });
  fill(view, h("h1", {}, "Upload an adapter"), form);
}
