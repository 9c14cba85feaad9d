// Operator: signed in with the admin token. The routing's warm-hit share and handoffs, each
// pool's workers (health, load, resident adapters) as this gateway sees them, and the
// registry's tenants with their quotas. Read-only, like the gateway's operator routes.
// Every string (tenant and key names, URLs, shas) goes into text nodes.

import * as api from "../api.js";
import { h, fill, field, table, notices, when, latestCall } from "../dom.js";

const WORKERS_PAGE = 20;
const TENANTS_PAGE = 50;
const MAX_TENANT_LIST_PAGES = 1000; // of the registry's (1,000 tenants each): a bound, not a plan
const REFRESH_MS = 10000; // the workers and routing numbers, while the page is shown
const SHOWN_SHAS = 20; // resident adapters listed per worker (the count says how many)

function percent(share) {
  return share === null || share === undefined ? "no requests yet" : `${(share * 100).toFixed(1)} %`;
}

function quota(value) {
  return value === null || value === undefined ? "default" : String(value);
}

function facts(pairs) {
  return h("dl", { class: "facts-grid" }, pairs.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

// Why a gateway with a decode pool served a request whole on one worker (operator.py's
// UNIFIED_REASONS), in the page's words.
const UNIFIED = [
  ["all_token_adapter", "Served whole: all-token adapter"],
  ["one_token", "Served whole: max_tokens 1"],
  ["option", "Served whole: an option spans both hops"],
];

function short(sha) {
  return String(sha).slice(0, 12);
}

/** A pool's workers, a page at a time (``after``: the last URL of the page before). Only
 * the latest call's answer is drawn: a 10 s refresh of one page that answers after Next or
 * Previous asked for another is dropped, so the rows and the cursors stay the same page. */
function workerSection(title, pool, alive) {
  const note = notices();
  const body = h("div", {}, h("p", { class: "loading" }, "Loading workers…"));
  const prev = h("button", { type: "button", class: "secondary", disabled: true }, "Previous");
  const next = h("button", { type: "button", class: "secondary", disabled: true }, "Next");
  const cursors = [null]; // the `after` of each page shown so far
  const opened = new Set(); // workers whose adapter list is open: kept open on a refresh
  const latest = latestCall();
  const section = h(
    "section",
    { "aria-label": title },
    h("h2", {}, title),
    ...note.nodes,
    body,
    h("div", { class: "row" }, prev, next),
  );

  async function load() {
    const current = latest();
    let page;
    try {
      page = await api.call("GET", "/v1/operator/workers", {
        query: { pool, limit: WORKERS_PAGE, after: cursors[cursors.length - 1], adapters: SHOWN_SHAS },
      });
    } catch (error) {
      if (!alive() || !current()) return;
      fill(body), note.fail(error);
      prev.disabled = cursors.length === 1;
      return;
    }
    if (!alive() || !current()) return;
    note.clear();
    const rows = page.data.map((w) => {
      const resident = w.resident_count
        ? h(
            "details",
            { open: opened.has(w.url), ontoggle: (event) => (event.target.open ? opened.add(w.url) : opened.delete(w.url)) },
            h("summary", {}, `${w.resident_count} loaded`),
            h("ul", { class: "shas" }, w.resident.map((sha) => h("li", { title: sha }, short(sha)))),
            w.resident_count > w.resident.length ? h("p", { class: "muted" }, `and ${w.resident_count - w.resident.length} more`) : null,
          )
        : "none";
      const health = h("span", { class: `badge ${w.healthy ? "serving" : "down"}` }, w.healthy ? "healthy" : `down (${w.failures} failed checks)`);
      return [w.url, health, String(w.inflight), String(w.others), String(w.inflight + w.others), resident];
    });
    const caption = `${page.total} ${page.total === 1 ? "worker" : "workers"}, ${page.healthy} healthy` + (page.cap === null ? "" : `; a worker takes up to ${page.cap} requests before new ones spill`);
    fill(body, table(caption, ["Worker", "Health", "In flight here", "Other gateways'", "Load", "Resident adapters"], rows));
    prev.disabled = cursors.length === 1;
    next.disabled = !page.has_more;
    next.onclick = () => {
      cursors.push(page.last);
      turn();
    };
  }
  // Until the asked-for page is drawn, a second click would move the cursors again.
  function turn() {
    prev.disabled = true;
    next.disabled = true;
    load();
  }
  prev.addEventListener("click", () => {
    cursors.pop();
    turn();
  });
  return { section, load };
}

function routingSection(alive) {
  const note = notices();
  const body = h("div", {}, h("p", { class: "loading" }, "Loading routing…"));
  const section = h("section", { "aria-label": "Routing" }, h("h2", {}, "Routing"), ...note.nodes, body);
  let hasDecode = false;
  const latest = latestCall();

  async function load() {
    const current = latest();
    let view;
    try {
      view = await api.call("GET", "/v1/operator/routing");
    } catch (error) {
      if (alive() && current()) fill(body), note.fail(error);
      return hasDecode;
    }
    if (!alive() || !current()) return hasDecode;
    note.clear();
    hasDecode = view.decode_pool;
    const d = view.decisions;
    const parts = [
      facts([
        ["Warm-hit share", percent(view.warm_hit_share)],
        ["Resident (warm)", String(d.resident)],
        ["Preferred (cold)", String(d.preferred)],
        ["Hot replica", String(d.replica)],
        ["Spilled", String(d.spill)],
      ]),
    ];
    if (view.decode_pool) {
      const o = view.handoffs;
      parts.push(
        h("h3", {}, "Handoffs to the decode pool"),
        facts([
          ["Decoded there", String(o.decoded)],
          ["Ended at the first token", String(o.first_token)],
          ["Fell back to one worker", String(o.fallback)],
          ["Decode hop failed", String(o.decode_failed)],
          ...UNIFIED.map(([reason, label]) => [label, String(view.unified[reason] || 0)]),
        ]),
      );
    } else {
      parts.push(h("p", { class: "muted" }, "No decode pool: every request is served whole by one worker."));
    }
    parts.push(h("p", { class: "muted" }, `This gateway's counts since ${when(new Date(view.started_at * 1000).toISOString())}.`));
    fill(body, ...parts);
    return hasDecode;
  }
  return { section, load };
}

function tenantSection(alive) {
  const note = notices();
  const filter = h("input", { type: "search", name: "tenant-filter", autocomplete: "off" });
  const body = h("div", {}, h("p", { class: "loading" }, "Loading tenants…"));
  const detail = h("div", { "aria-live": "polite" });
  const prev = h("button", { type: "button", class: "secondary", disabled: true }, "Previous");
  const next = h("button", { type: "button", class: "secondary", disabled: true }, "Next");
  const section = h(
    "section",
    { "aria-label": "Tenants" },
    h("h2", {}, "Tenants"),
    h("div", { class: "row" }, field("Filter by name", filter)),
    ...note.nodes,
    body,
    h("div", { class: "row" }, prev, next),
    detail,
  );
  let tenants = [];
  let start = 0;
  const latestList = latestCall();
  const latestDetail = latestCall(); // tenant A, then B: A's late answer is not drawn

  function draw() {
    const wanted = filter.value.trim().toLowerCase();
    const matching = wanted ? tenants.filter((t) => String(t.name).toLowerCase().includes(wanted)) : tenants;
    start = Math.min(start, Math.max(0, matching.length - 1));
    start -= start % TENANTS_PAGE;
    const shown = matching.slice(start, start + TENANTS_PAGE);
    const rows = shown.map((t) => {
      const open = h("button", { type: "button", class: "link" }, String(t.name));
      open.addEventListener("click", () => showTenant(t.name));
      const q = t.quota || {};
      return [open, when(t.created_at), String(t.adapters), quota(q.max_adapters), quota(q.max_stored_bytes)];
    });
    const caption = matching.length
      ? `${start + 1}–${start + shown.length} of ${matching.length} tenants`
      : "No tenant matches.";
    fill(body, table(caption, ["Tenant", "Created", "Adapters", "Max adapters", "Max stored bytes"], rows));
    prev.disabled = start === 0;
    next.disabled = start + TENANTS_PAGE >= matching.length;
  }

  async function showTenant(name) {
    const current = latestDetail();
    fill(detail, h("p", { class: "loading" }, "Loading the tenant…"));
    const path = `/v1/tenants/${encodeURIComponent(name)}`;
    let tenant;
    let limits;
    try {
      [tenant, limits] = await Promise.all([api.call("GET", path), api.call("GET", `${path}/limits`)]);
    } catch (error) {
      if (alive() && current()) fill(detail), note.fail(error);
      return;
    }
    if (!alive() || !current()) return;
    const q = tenant.quota || {};
    const limitRows = Object.entries(limits || {}).map(([k, v]) => [k, v === null ? "gateway default" : String(v)]);
    const keyRows = (tenant.keys || []).map((k) => [k.key_id, k.name || "", k.role, when(k.created_at), k.expires_at ? when(k.expires_at) : "never", when(k.last_used_at)]);
    fill(
      detail,
      h("h3", {}, `Tenant ${tenant.name}`),
      facts([
        ["Max adapters", quota(q.max_adapters)],
        ["Max stored bytes", quota(q.max_stored_bytes)],
        ["A user without a binding gets", String(tenant.unbound_user)],
      ]),
      table("Rate limits", ["Limit", "Value"], limitRows),
      table("API keys (no secrets)", ["Key id", "Name", "Role", "Created", "Expires", "Last used"], keyRows),
    );
  }

  filter.addEventListener("input", () => {
    start = 0;
    draw();
  });
  prev.addEventListener("click", () => {
    start = Math.max(0, start - TENANTS_PAGE);
    draw();
  });
  next.addEventListener("click", () => {
    start += TENANTS_PAGE;
    draw();
  });

  // The registry answers a page of tenants at a time, with a Link to the next one; the
  // filter searches them all, so every page is read (only ever the tenant list's own URL).
  async function load() {
    const current = latestList();
    const listed = [];
    try {
      let path = "/v1/tenants";
      for (let pages = 0; path && pages < MAX_TENANT_LIST_PAGES && alive() && current(); pages += 1) {
        const page = await api.answer("GET", path);
        listed.push(...(Array.isArray(page.body) ? page.body : []));
        const following = api.nextLink(page.headers.get("Link"));
        path = following && following.startsWith("/v1/tenants?") ? following : null;
      }
    } catch (error) {
      if (alive() && current()) fill(body), note.fail(error);
      return;
    }
    if (!alive() || !current()) return;
    note.clear();
    tenants = listed;
    draw();
  }
  return { section, load };
}

export function render(view, _params, alive) {
  const routing = routingSection(alive);
  const workers = workerSection("Workers", "prefill", alive);
  const decode = workerSection("Decode pool", "decode", alive);
  decode.section.hidden = true;
  const tenants = tenantSection(alive);
  const refresh = h("button", { type: "button", class: "secondary" }, "Refresh");
  fill(
    view,
    h("h1", {}, "Operator"),
    h("div", { class: "row" }, h("p", { class: "muted" }, "What this gateway sees of the pools, and the registry's tenants."), refresh),
    routing.section,
    workers.section,
    decode.section,
    tenants.section,
  );

  async function live() {
    const hasDecode = await routing.load();
    workers.load();
    decode.section.hidden = !hasDecode;
    if (hasDecode) decode.load();
  }
  refresh.addEventListener("click", () => {
    live();
    tenants.load();
  });
  live();
  tenants.load();
  const timer = setInterval(() => {
    if (!alive()) clearInterval(timer);
    else live();
  }, REFRESH_MS);
}
