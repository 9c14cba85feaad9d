// Usage: the tenant's requests and tokens per day or hour, per adapter, user or key, as
// /v1/usage reports them; a chart of requests per bucket and a CSV of the table.

import * as api from "../api.js";
import { h, fill, field, table, notices, saveFile } from "../dom.js";
import { barChart } from "../charts.js";

function csvCell(value) {
  const text = String(value);
  // A leading =, +, - or @ would be a formula in a spreadsheet: quoted and prefixed.
  const safe = /^[=+\-@]/.test(text) ? `'${text}` : text;
  return /[",\n']/.test(safe) ? `"${safe.replaceAll('"', '""')}"` : safe;
}

export function render(view, _params, alive) {
  const note = notices();
  const groupBy = h("select", { name: "group-by" }, h("option", { value: "day" }, "day"), h("option", { value: "hour" }, "hour"));
  const by = h(
    "select",
    { name: "by" },
    h("option", { value: "model" }, "adapter (model)"),
    h("option", { value: "user" }, "user"),
    h("option", { value: "key" }, "API key"),
  );
  const since = h("input", { type: "date", name: "since" });
  const form = h(
    "form",
    { class: "row", "aria-label": "Usage query" },
    field("Per", groupBy),
    field("By", by),
    field("Since (default: 7 days / 24 hours)", since),
    h("button", { type: "submit" }, "Show"),
  );
  const chart = h("div");
  const body = h("div");
  const csv = h("button", { type: "button", class: "secondary", disabled: true }, "Export CSV");
  fill(view, h("h1", {}, "Usage"), form, ...note.nodes, chart, body, csv);
  let rows = [];

  csv.addEventListener("click", () => {
    const lines = [["bucket", "name", "requests", "prompt_tokens", "completion_tokens"], ...rows];
    saveFile(`usage-${groupBy.value}-${by.value}.csv`, lines.map((r) => r.map(csvCell).join(",")).join("\n") + "\n");
  });

  async function load() {
    fill(body, h("p", { class: "loading" }, "Loading usage…"));
    note.clear();
    let report;
    try {
      report = await api.call("GET", "/v1/usage", {
        query: { group_by: groupBy.value, by: by.value, since: since.value },
      });
    } catch (error) {
      if (alive()) fill(body), note.fail(error);
      return;
    }
    if (!alive()) return;
    rows = [];
    const points = [];
    for (const bucket of report.buckets) {
      let total = 0;
      const items = [...bucket.items];
      if (bucket.no_user && bucket.no_user.requests) items.push({ name: "(no user)", ...bucket.no_user });
      // Past the first users or keys a bucket names, the rest are summed here.
      if (bucket.other && bucket.other.requests) items.push({ name: "(others)", ...bucket.other });
      for (const item of items) {
        rows.push([bucket.start, item.name, item.requests, item.prompt_tokens, item.completion_tokens]);
        total += item.requests;
      }
      points.push({ label: bucket.start.slice(0, groupBy.value === "day" ? 10 : 13), value: total });
    }
    fill(chart, points.length ? barChart("Requests per bucket", points) : null);
    fill(
      body,
      rows.length
        ? table(null, ["Bucket", "Name", "Requests", "Prompt tokens", "Completion tokens"], rows.map((r) => r.map(String)))
        : h("p", { class: "muted" }, "No usage in this range."),
    );
    csv.disabled = !rows.length;
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
  load();
}
