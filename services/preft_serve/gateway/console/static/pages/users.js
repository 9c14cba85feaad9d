// Users: the tenant's bindings, bound and unbound through /v1/users. The registry
// answers a page of bindings at a time (by user id); the first page is loaded and "Load
// more" appends the next, and the search and pages here cover what is loaded.

import * as api from "../api.js";
import { h, fill, field, table, notices, confirmDialog } from "../dom.js";

const PAGE = 25;
const FETCH = 1000; // bindings asked of the registry at once (its most)

export function render(view, _params, alive) {
  const note = notices();
  let bindings = [];
  let cursor = null; // where the registry's next page starts; null: all loaded
  let generation = 0; // bumped by each reload: an answer for an older one is dropped
  let fetching = false; // a "Load more" in flight
  let page = 0;
  const search = h("input", { type: "search", name: "search", autocomplete: "off" });
  const body = h("div", {}, h("p", { class: "loading" }, "Loading bindings…"));
  const pager = h("div", { class: "row" });
  const more = h("div", { class: "row" });
  const user = h("input", { name: "user-id", required: true, autocomplete: "off", maxlength: "128" });
  const adapter = h("input", { name: "adapter", required: true, autocomplete: "off", list: "adapter-names" });
  const names = h("datalist", { id: "adapter-names" });
  const bind = h(
    "form",
    { class: "row", "aria-label": "Bind a user" },
    field("User id", user),
    field("Adapter", adapter),
    names,
    h("button", { type: "submit" }, "Bind"),
  );
  fill(
    view,
    h("h1", {}, "Users"),
    bind,
    ...note.nodes,
    h("h2", {}, "Bindings"),
    h("div", { class: "row" }, field("Search user or adapter", search)),
    body,
    pager,
    more,
  );

  function draw() {
    const needle = search.value.trim().toLowerCase();
    const shown = bindings.filter(
      (b) => !needle || b.user.toLowerCase().includes(needle) || b.adapter.toLowerCase().includes(needle),
    );
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.min(page, pages - 1);
    const rows = shown.slice(page * PAGE, (page + 1) * PAGE).map((b) => {
      const unbind = h("button", { type: "button", class: "danger", "aria-label": `Unbind ${b.user}` }, "Unbind");
      unbind.addEventListener("click", async () => {
        if (!(await confirmDialog(`Unbind ${b.user}? They get the base model.`, "Unbind"))) return;
        try {
          await api.call("DELETE", `/v1/users/${encodeURIComponent(b.user)}`);
        } catch (error) {
          note.fail(error);
          return;
        }
        note.say(`Unbound ${b.user}.`);
        load();
      });
      return [b.user, h("a", { href: `#/adapters/${encodeURIComponent(b.adapter)}` }, b.adapter), unbind];
    });
    fill(
      body,
      rows.length ? table(null, ["User", "Adapter", ""], rows) : h("p", { class: "muted" }, "No bindings match."),
    );
    const prev = h("button", { type: "button", class: "secondary", disabled: page === 0 }, "Previous page");
    const next = h("button", { type: "button", class: "secondary", disabled: page >= pages - 1 }, "Next page");
    prev.addEventListener("click", () => {
      page -= 1;
      draw();
    });
    next.addEventListener("click", () => {
      page += 1;
      draw();
    });
    const counted = cursor ? `${shown.length} of the bindings loaded` : `${shown.length} bindings`;
    fill(pager, prev, h("span", { class: "muted" }, `Page ${page + 1} of ${pages} (${counted})`), next);
    if (!cursor) {
      fill(more);
      return;
    }
    const button = h("button", { type: "button", class: "secondary", disabled: fetching }, "Load more bindings");
    button.addEventListener("click", () => {
      button.disabled = true;
      fetchPage(cursor);
    });
    fill(more, h("span", { class: "muted" }, "The search covers the bindings loaded. "), button);
  }
  search.addEventListener("input", () => {
    page = 0;
    draw();
  });

  bind.addEventListener("submit", async (event) => {
    event.preventDefault();
    const id = user.value.trim();
    let bound;
    try {
      bound = await api.call("PUT", `/v1/users/${encodeURIComponent(id)}`, { json: { adapter: adapter.value.trim() } });
    } catch (error) {
      note.fail(error);
      return;
    }
    note.say(`Bound ${bound.user} to ${bound.adapter} (version ${bound.version}).`);
    user.value = "";
    load();
  });

  function load() {
    generation += 1;
    fetching = false;
    return fetchPage(null);
  }
  async function fetchPage(after) {
    const mine = generation;
    fetching = after !== null;
    let answer;
    try {
      const query = after ? { limit: FETCH, cursor: after } : { limit: FETCH };
      answer = await api.call("GET", "/v1/users", { query });
    } catch (error) {
      if (!alive() || mine !== generation) return;
      fetching = false;
      if (after === null) fill(body); // a failed "Load more" keeps what is shown
      note.fail(error);
      if (after !== null) draw();
      return;
    }
    if (!alive() || mine !== generation) return; // a reload started since
    fetching = false;
    bindings = after ? bindings.concat(answer.items) : answer.items;
    cursor = answer.next_cursor;
    draw();
  }
  async function loadNames() {
    try {
      const page = await api.call("GET", "/v1/adapters", { query: { limit: 200 } });
      if (alive()) fill(names, page.items.map((a) => h("option", { value: a.name })));
    } catch {
      // the list only helps typing; the bind call says what is wrong
    }
  }
  load();
  loadNames();
}
