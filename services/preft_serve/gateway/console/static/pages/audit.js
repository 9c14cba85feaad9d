// Audit log: who changed what in this tenant (admin role), oldest first, paged with the
// log's own cursor.

import * as api from "../api.js";
import { h, fill, field, table, notices, when } from "../dom.js";

const PAGE = 100;

export function render(view, _params, alive) {
  const note = notices();
  const action = h("input", { name: "action", autocomplete: "off", maxlength: "64" });
  const actor = h("input", { name: "actor", autocomplete: "off", maxlength: "64" });
  const form = h(
    "form",
    { class: "row", "aria-label": "Filter the audit log" },
    field("Action", action),
    field("Actor (key id)", actor),
    h("button", { type: "submit" }, "Filter"),
  );
  const body = h("div", {}, h("p", { class: "loading" }, "Loading the audit log…"));
  const more = h("button", { type: "button", class: "secondary", disabled: true }, "Later entries");
  fill(view, h("h1", {}, "Audit log"), form, ...note.nodes, body, more);
  let after = null;
  let rows = [];

  async function load(reset) {
    if (reset) {
      after = null;
      rows = [];
    }
    note.clear();
    let page;
    try {
      page = await api.call("GET", "/v1/audit", {
        query: { limit: PAGE, after, action: action.value.trim(), actor: actor.value.trim() },
      });
    } catch (error) {
      if (alive()) fill(body), note.fail(error);
      return;
    }
    if (!alive()) return;
    rows = rows.concat(
      page.data.map((e) => [when(e.time), e.actor, e.action, e.target, e.before || "", e.after || "", e.request_id || ""]),
    );
    after = page.next_cursor;
    more.disabled = !after;
    fill(
      body,
      rows.length
        ? table(null, ["Time", "Actor", "Action", "Target", "Before", "After", "Request id"], rows)
        : h("p", { class: "muted" }, "No entries."),
    );
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load(true);
  });
  more.addEventListener("click", () => load(false));
  load(true);
}
