// DOM helpers: every string a tenant or the API controls becomes a text node or an
// attribute value set one by one, never parsed as markup (no HTML-string sink anywhere).

/** An element: h("button", {class: "x", onclick: fn, disabled: true}, "text", child). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "class") el.className = value;
    else if (name in el && typeof value !== "string") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace ``el``'s children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A labelled control: the label wraps it, so clicking and screen readers find it. */
export function field(text, control, cls) {
  return h("label", { class: cls }, text, control);
}

/** A table with one header row; ``rows`` are arrays of cells (strings or nodes). */
export function table(caption, headers, rows) {
  return h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      {},
      caption ? h("caption", { class: "muted" }, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell))))),
    ),
  );
}

/** A status line (role=status) and an error line (role=alert), set by ``say``/``fail``. */
export function notices() {
  const status = h("p", { role: "status", class: "ok" });
  const alert = h("p", { role: "alert", class: "error" });
  return {
    nodes: [status, alert],
    say(text) {
      alert.textContent = "";
      status.textContent = text;
    },
    fail(error) {
      status.textContent = "";
      alert.textContent = error instanceof Error ? error.message : String(error);
    },
    clear() {
      status.textContent = "";
      alert.textContent = "";
    },
  };
}

/** Ask before something that cannot be undone: a modal dialog, resolved true on confirm. */
export function confirmDialog(question, action = "Delete") {
  return new Promise((resolve) => {
    const dialog = h(
      "dialog",
      { "aria-label": "Confirm" },
      h("p", {}, question),
      h(
        "form",
        { method: "dialog", class: "row" },
        h("button", { value: "cancel", class: "secondary" }, "Cancel"),
        h("button", { value: "confirm", class: "danger" }, action),
      ),
    );
    dialog.addEventListener("close", () => {
      resolve(dialog.returnValue === "confirm");
      dialog.remove();
    });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/**
 * A latest-call guard for one part of a page: ``const latest = latestCall();`` once, then
 * ``const current = latest();`` as each call starts and, once it answers, draw only if
 * ``current()`` is still true: an answer that a later call overtook is dropped.
 */
export function latestCall() {
  let counter = 0;
  return () => {
    const mine = ++counter;
    return () => mine === counter;
  };
}

export function when(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().replace(".000Z", "Z");
}

/** Offer ``text`` as a download named ``name`` (a blob URL, revoked once clicked). */
export function saveFile(name, text, type = "text/csv") {
  const link = h("a", { href: URL.createObjectURL(new Blob([text], { type })), download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

/** The page for a link naming something the registry's rules refuse: nothing is requested
 *  (a '.' segment would be folded by the browser onto another route). */
export function refusedLink(view, heading, message, back, backLabel) {
  fill(
    view,
    h("h1", {}, heading),
    h("p", { class: "error", role: "alert" }, message),
    h("p", {}, h("a", { href: back }, backLabel)),
  );
}
