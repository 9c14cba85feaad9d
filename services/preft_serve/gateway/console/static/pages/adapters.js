// Adapters: the list, and one adapter's versions, serving policy, evaluation results and
// usage (per day, and per version served: requests, tokens, errors, mean time to first
// token over a chosen window), with promote, split, roll back and delete.

import * as api from "../api.js";
import { h, fill, field, table, notices, confirmDialog, when } from "../dom.js";

const PAGE = 50;
const HOUR_MS = 3600 * 1000;
// The per-version window: its label, the usage breakdown's bucket and how far back it goes.
const WINDOWS = [
  { value: "24h", label: "Last 24 hours", group_by: "hour", hours: 24 },
  { value: "7d", label: "Last 7 days", group_by: "day", hours: 7 * 24 },
  { value: "30d", label: "Last 30 days", group_by: "day", hours: 30 * 24 },
];

export function render(view, [name], alive) {
  if (name) detail(view, name, alive);
  else list(view, alive);
}

function adapterLink(name) {
  return h("a", { href: `#/adapters/${encodeURIComponent(name)}` }, name);
}

function list(view, alive) {
  const body = h("div", {}, h("p", { class: "loading" }, "Loading adapters…"));
  const note = notices();
  const cursors = [null];
  fill(
    view,
    h("h1", {}, "Adapters"),
    h("p", {}, h("a", { href: "#/upload" }, "Upload an adapter")),
    ...note.nodes,
    body,
  );
  async function load() {
    let page;
    try {
      page = await api.call("GET", "/v1/adapters", {
        query: { limit: PAGE, cursor: cursors[cursors.length - 1] },
      });
    } catch (error) {
      if (alive()) fill(body), note.fail(error);
      return;
    }
    if (!alive()) return;
    const rows = page.items.map((a) => [
      adapterLink(a.name),
      String(a.version),
      a.type,
      a.mode,
      String(a.rank),
      String(a.bound_users),
      when(a.updated_at),
    ]);
    const more = h("button", { type: "button", class: "secondary", disabled: !page.next_cursor }, "Next page");
    more.addEventListener("click", () => {
      cursors.push(page.next_cursor);
      load();
    });
    const back = h("button", { type: "button", class: "secondary", disabled: cursors.length < 2 }, "Previous page");
    back.addEventListener("click", () => {
      cursors.pop();
      load();
    });
    fill(
      body,
      rows.length
        ? table(null, ["Name", "Served version", "Type", "Mode", "Rank", "Bound users", "Updated"], rows)
        : h("p", { class: "muted" }, "No adapters yet."),
      h("div", { class: "row" }, back, more),
    );
  }
  load();
}

function badge(state) {
  return h("span", { class: `badge ${state}` }, state);
}

function evaluation(result) {
  if (!result) return "";
  const score = `${(result.score * 100).toFixed(1)}%`;
  const against =
    result.serving_version === null
      ? ""
      : ` vs v${result.serving_version} ${(result.serving_score * 100).toFixed(1)}%`;
  return h(
    "span",
    { class: result.passed ? "ok" : "error" },
    `${result.passed ? "passed" : "failed"}: ${result.metric} ${score}${against} on ${result.examples} examples`,
  );
}

function detail(view, name, alive) {
  const path = `/v1/adapters/${encodeURIComponent(name)}`;
  const note = notices();
  const summary = h("div", {}, h("p", { class: "loading" }, "Loading…"));
  const versions = h("div");
  const split = h("div");
  const usage = h("div", {}, h("p", { class: "loading" }, "Loading usage…"));
  const perVersion = h("div", {}, h("p", { class: "loading" }, "Loading usage per version…"));
  const windowSelect = h(
    "select",
    { name: "version-window" },
    WINDOWS.map((w) => h("option", { value: w.value, selected: w.value === "7d" }, w.label)),
  );
  windowSelect.addEventListener("change", () => loadVersionUsage());
  const remove = h("button", { type: "button", class: "danger" }, "Delete adapter");
  fill(
    view,
    h("p", {}, h("a", { href: "#/adapters" }, "← Adapters")),
    h("h1", {}, "Adapter ", h("span", { class: "name" }, name)),
    ...note.nodes,
    summary,
    h("h2", {}, "Versions"),
    versions,
    h("h2", {}, "Split (canary)"),
    split,
    h("h2", {}, "Usage per version"),
    h("div", { class: "row" }, field("Window", windowSelect)),
    perVersion,
    h("h2", {}, "Usage, last 7 days"),
    usage,
    h("h2", {}, "Delete"),
    h("p", { class: "muted" }, "Deletes every version. Bound users are unbound first if you confirm."),
    remove,
  );
  remove.addEventListener("click", async () => {
    if (!(await confirmDialog(`Delete adapter ${name} and every version?`))) return;
    try {
      await api.call("DELETE", path, { query: { force: "true" } });
    } catch (error) {
      note.fail(error);
      return;
    }
    location.hash = "#/adapters";
  });

  async function act(label, method, suffix, json, query) {
    note.say(`${label}…`);
    try {
      await api.call(method, `${path}${suffix}`, { json, query });
    } catch (error) {
      if (alive()) note.fail(error);
      return;
    }
    if (!alive()) return;
    note.say(`${label}: done.`);
    load();
  }

  async function load() {
    let adapter;
    let policy;
    try {
      [adapter, policy] = await Promise.all([api.call("GET", path), api.call("GET", `${path}/policy`)]);
    } catch (error) {
      if (alive()) fill(summary), note.fail(error);
      return;
    }
    if (!alive()) return;
    fill(
      summary,
      h(
        "dl",
        { class: "row" },
        h("div", {}, h("dt", {}, "Serving"), h("dd", {}, `version ${policy.version}`)),
        h("div", {}, h("dt", {}, "Split"), h("dd", {}, policy.canary ? `version ${policy.canary.version} to ${policy.canary.weight * 100}% of users` : "none")),
        h("div", {}, h("dt", {}, "Bound users"), h("dd", {}, String(adapter.bound_users))),
        h("div", {}, h("dt", {}, "Base model"), h("dd", {}, adapter.base_model)),
      ),
    );
    const rows = policy.versions
      .slice()
      .reverse()
      .map((v) => {
        const actions = h("div", { class: "row" });
        if (v.version !== policy.version) {
          const promote = h("button", { type: "button" }, v.state === "retired" ? "Roll back to this" : "Promote");
          promote.setAttribute("aria-label", `${promote.textContent} version ${v.version}`);
          promote.addEventListener("click", () =>
            act(`Serving version ${v.version}`, "POST", `/versions/${v.version}/promote`),
          );
          actions.append(promote);
        }
        return [
          `v${v.version}`,
          badge(v.state),
          h("code", { title: v.sha256 }, v.sha256.slice(0, 12)),
          `${v.type} r${v.rank} ${v.mode}`,
          `${(v.size_bytes / 1024).toFixed(1)} KiB`,
          when(v.created_at),
          evaluation(v.evaluation),
          actions,
        ];
      });
    fill(versions, table(null, ["Version", "State", "sha256", "Kind", "Size", "Created", "Evaluation", "Actions"], rows));
    drawSplit(policy);
  }

  function drawSplit(policy) {
    const others = policy.versions.filter((v) => v.version !== policy.version);
    if (!others.length) {
      fill(split, h("p", { class: "muted" }, "Upload another version to split traffic."));
      return;
    }
    const version = h(
      "select",
      { name: "canary-version" },
      others.map((v) => h("option", { value: String(v.version), selected: policy.canary && policy.canary.version === v.version }, `v${v.version}`)),
    );
    const weight = h("input", {
      type: "number",
      name: "canary-weight",
      min: "0.01",
      max: "0.99",
      step: "0.01",
      required: true,
      value: policy.canary ? String(policy.canary.weight) : "0.1",
    });
    const form = h(
      "form",
      { class: "row", "aria-label": "Set split" },
      field("Canary version", version),
      field("Share of users (0–1)", weight),
      h("button", { type: "submit" }, "Set split"),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      act("Setting the split", "PUT", "/policy", {
        version: policy.version,
        canary: { version: Number(version.value), weight: Number(weight.value) },
      });
    });
    const clear = h("button", { type: "button", class: "secondary", disabled: !policy.canary }, "Remove split");
    clear.addEventListener("click", () => act("Removing the split", "PUT", "/policy", { version: policy.version, canary: null }));
    fill(split, form, clear);
  }

  async function loadUsage() {
    let report;
    try {
      report = await api.call("GET", "/v1/usage", { query: { group_by: "day", by: "model" } });
    } catch (error) {
      if (alive()) fill(usage, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive()) return;
    const rows = [];
    for (const bucket of report.buckets) {
      for (const item of bucket.items) {
        if (item.name === name) {
          rows.push([bucket.start.slice(0, 10), String(item.requests), String(item.prompt_tokens), String(item.completion_tokens)]);
        }
      }
    }
    fill(
      usage,
      rows.length
        ? table(null, ["Day", "Requests", "Prompt tokens", "Completion tokens"], rows)
        : h("p", { class: "muted" }, "No requests in the last 7 days."),
    );
  }
  // Each version's requests, tokens, errors and mean time to first token over the window,
  // summed over the breakdown's buckets (the mean from the sums, not a mean of means).
  let versionCall = 0;
  async function loadVersionUsage() {
    const chosen = WINDOWS.find((w) => w.value === windowSelect.value) || WINDOWS[1];
    const call = ++versionCall;
    // The window's first bucket: this hour (UTC day) and the ones before it.
    const step = chosen.group_by === "day" ? 24 * HOUR_MS : HOUR_MS;
    const buckets = chosen.group_by === "day" ? chosen.hours / 24 : chosen.hours;
    const since = new Date((Math.floor(Date.now() / step) - (buckets - 1)) * step);
    let report;
    try {
      report = await api.call("GET", "/v1/usage", {
        query: { by: "version", group_by: chosen.group_by, since: since.toISOString() },
      });
    } catch (error) {
      if (alive() && call === versionCall) fill(perVersion, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive() || call !== versionCall) return;
    const prefix = `${name}@`;
    const totals = new Map();
    for (const bucket of report.buckets) {
      for (const item of bucket.items) {
        if (!item.name.startsWith(prefix)) continue;
        const version = Number(item.name.slice(prefix.length));
        if (!Number.isInteger(version)) continue;
        const t = totals.get(version) || { requests: 0, prompt: 0, completion: 0, errors: 0, ttftSum: 0, ttftCount: 0 };
        t.requests += item.requests;
        t.prompt += item.prompt_tokens;
        t.completion += item.completion_tokens;
        t.errors += item.errors || 0;
        t.ttftSum += item.ttft_seconds_sum || 0;
        t.ttftCount += item.ttft_count || 0;
        totals.set(version, t);
      }
    }
    const rows = [...totals.entries()]
      .sort((a, b) => b[0] - a[0])
      .map(([version, t]) => [
        `v${version}`,
        String(t.requests),
        String(t.prompt),
        String(t.completion),
        String(t.errors),
        t.ttftCount ? `${Math.round((t.ttftSum / t.ttftCount) * 1000)} ms (${t.ttftCount} streamed)` : "–",
      ]);
    fill(
      perVersion,
      rows.length
        ? table(
            "Errors: requests that failed after the version was chosen. Time to first token: streamed requests.",
            ["Version", "Requests", "Prompt tokens", "Completion tokens", "Errors", "Mean time to first token"],
            rows,
          )
        : h("p", { class: "muted" }, `No requests to ${name} in this window.`),
    );
  }
  load();
  loadVersionUsage();
  loadUsage();
}
