// Keys: the tenant's API keys (admin role), issue one (its secret shown once), revoke.

import * as api from "../api.js";
import { h, fill, field, table, notices, confirmDialog, when } from "../dom.js";

export function render(view, _params, alive) {
  const note = notices();
  const role = h(
    "select",
    { name: "role" },
    ["inference", "developer", "admin"].map((r) => h("option", { value: r }, r)),
  );
  const name = h("input", { name: "key-name", autocomplete: "off" });
  const secret = h("div", { "aria-live": "polite" });
  const body = h("div", {}, h("p", { class: "loading" }, "Loading keys…"));
  const form = h(
    "form",
    { class: "row", "aria-label": "Issue a key" },
    field("Role", role),
    field("Name (optional)", name),
    h("button", { type: "submit" }, "Issue key"),
  );
  fill(view, h("h1", {}, "API keys"), form, ...note.nodes, secret, body);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const json = { role: role.value };
    if (name.value.trim()) json.name = name.value.trim();
    let created;
    try {
      created = await api.call("POST", "/v1/keys", { json });
    } catch (error) {
      note.fail(error);
      return;
    }
    note.say(`Issued ${created.key_id}.`);
    fill(secret, h("p", {}, "Copy the key now; it is not shown again:"), h("p", { class: "secret" }, created.api_key));
    name.value = "";
    load();
  });

  async function load() {
    let keys;
    try {
      keys = await api.call("GET", "/v1/keys");
    } catch (error) {
      if (alive()) fill(body), note.fail(error);
      return;
    }
    if (!alive()) return;
    const items = Array.isArray(keys) ? keys : keys.data || keys.items || [];
    const rows = items.map((k) => {
      const revoke = h("button", { type: "button", class: "danger", "aria-label": `Revoke ${k.key_id}` }, "Revoke");
      revoke.addEventListener("click", async () => {
        if (!(await confirmDialog(`Revoke key ${k.key_id}? Requests with it fail at once.`, "Revoke"))) return;
        try {
          await api.call("DELETE", `/v1/keys/${encodeURIComponent(k.key_id)}`);
        } catch (error) {
          note.fail(error);
          return;
        }
        note.say(`Revoked ${k.key_id}.`);
        load();
      });
      return [k.key_id, k.name || "", k.role, when(k.created_at), k.expires_at ? when(k.expires_at) : "never", when(k.last_used_at), k.created_by || "", revoke];
    });
    fill(body, table(null, ["Key id", "Name", "Role", "Created", "Expires", "Last used", "Created by", ""], rows));
  }
  load();
}
