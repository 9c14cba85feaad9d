// Adapters: the list, and one adapter's versions, serving policy, evaluation gate and
// results, and usage (per day, and per version served: requests, tokens, errors, mean time
// to first token over a chosen window), with promote (and force past the gate), split,
// roll back and delete.

import * as api from "../api.js";
import { h, fill, field, table, notices, confirmDialog, when, latestCall, refusedLink } from "../dom.js";

const PAGE = 50;
// Answers by which the registry refused an evaluation and stored nothing; any other failure
// (no answer in time, a 502/503/504 on the way) leaves open whether it was attached.
const REFUSED = new Set([400, 404, 409, 413, 422]);
const HOUR_MS = 3600 * 1000;
// An evaluation run serves every example (at most 200) to two versions: minutes, not 30 s.
const RUN_TIMEOUT_MS = 10 * 60 * 1000;
const METRICS = [
  { value: "exact", label: "exact (answer equals the expected one)", maxMargin: "1" },
  { value: "contains", label: "contains (answer contains the expected one)", maxMargin: "1" },
  { value: "loss", label: "loss (nats per expected-answer token)", maxMargin: "10" },
];
// The per-version window: its label, the usage breakdown's bucket and how far back it goes.
const WINDOWS = [
  { value: "24h", label: "Last 24 hours", group_by: "hour", hours: 24 },
  { value: "7d", label: "Last 7 days", group_by: "day", hours: 7 * 24 },
  { value: "30d", label: "Last 30 days", group_by: "day", hours: 30 * 24 },
];

// The registry's rule for adapter names: only such a name goes into a request path.
const ADAPTER_NAME = /^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export function render(view, [name], alive) {
  if (name && !ADAPTER_NAME.test(name)) {
    const rule = "names are 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.";
    refusedLink(view, "Adapters", `That is not an adapter name: ${rule}`, "#/adapters", "All adapters");
  } else if (name) detail(view, name, alive);
  else list(view, alive);
}

// A share of users as a percentage, without float noise (0.07 -> "7%", not 7.000000000000001).
function percent(weight) {
  return `${Math.round(weight * 10000) / 100}%`;
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

/** A score as the metric means it: a share of examples, or nats per token for loss. */
function scored(metric, score) {
  return metric === "loss" ? `${score.toFixed(3)} nats/token` : `${(score * 100).toFixed(1)}%`;
}

function evaluation(result) {
  if (!result) return "";
  const score = scored(result.metric, result.score);
  const against =
    result.serving_version === null
      ? ""
      : ` vs v${result.serving_version} ${scored(result.metric, result.serving_score)}`;
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
  const gate = h("div", {}, h("p", { class: "loading" }, "Loading the evaluation…"));
  const attach = attachForm();
  // The run's form is redrawn with the versions; its waiting line, error and outcome stay.
  const run = h("div");
  const runBusy = h("p", { class: "loading", hidden: true });
  const runError = h("p", { class: "error", role: "alert", id: "evaluation-run-error", hidden: true });
  const runOutcome = h("p", { id: "evaluation-run-result", hidden: true });
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
    h("h2", {}, "Evaluation gate"),
    h(
      "p",
      { class: "muted" },
      "With an evaluation attached, a staged version is promoted only after a passing run " +
        "(its score at most the margin below the serving version's, on the same file).",
    ),
    gate,
    h("h3", {}, "Attach an evaluation"),
    attach.form,
    attach.error,
    h("h3", {}, "Run the evaluation"),
    run,
    runBusy,
    runError,
    runOutcome,
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

  // ``refused(error)`` may take an error for itself (true); the page's alert shows the rest.
  async function act(label, method, suffix, json, query, refused, ifMatch) {
    note.say(`${label}…`);
    try {
      await api.call(method, `${path}${suffix}`, { json, query, ifMatch });
    } catch (error) {
      if (!alive()) return;
      if (refused && refused(error)) note.clear();
      else note.fail(error);
      if (error.status === 412) load(); // changed meanwhile: show what it is now
      return;
    }
    if (!alive()) return;
    note.say(`${label}: done.`);
    load();
  }

  // Each reader draws only its latest call's answer (a slower, earlier one is dropped).
  const latestLoad = latestCall();
  async function load() {
    const current = latestLoad();
    let adapter;
    let policy;
    let policyTag;
    try {
      let read;
      [adapter, read] = await Promise.all([api.call("GET", path), api.answer("GET", `${path}/policy`)]);
      [policy, policyTag] = [read.body, read.headers.get("ETag")];
    } catch (error) {
      if (alive() && current()) fill(summary), note.fail(error);
      return;
    }
    if (!alive() || !current()) return;
    fill(
      summary,
      h(
        "dl",
        { class: "row" },
        h("div", {}, h("dt", {}, "Serving"), h("dd", {}, `version ${policy.version}`)),
        h("div", {}, h("dt", {}, "Split"), h("dd", {}, policy.canary ? `version ${policy.canary.version} to ${percent(policy.canary.weight)} of users` : "none")),
        h("div", {}, h("dt", {}, "Bound users"), h("dd", {}, String(adapter.bound_users))),
        h("div", {}, h("dt", {}, "Base model"), h("dd", {}, adapter.base_model)),
      ),
    );
    const rows = policy.versions
      .slice()
      .reverse()
      .map((v) => {
        const actions = v.version === policy.version ? "" : promoteControls(v, policyTag);
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
    drawSplit(policy, policyTag);
    drawRun(policy);
  }

  // Promote (or roll back); a staged version the gate holds back gets the registry's
  // refusal next to its button and a force button, which asks first. Both carry the tag of
  // the policy the page showed: a promote or split made elsewhere since then gets 412 (and
  // the page redraws) instead of being undone.
  function promoteControls(v, policyTag) {
    const label = v.state === "retired" ? "Roll back to this" : "Promote";
    const refusalId = `promote-refusal-${v.version}`;
    const promote = h(
      "button",
      { type: "button", "aria-label": `${label} version ${v.version}`, "aria-describedby": refusalId },
      label,
    );
    const refusal = h("p", { class: "error", role: "alert", id: refusalId, hidden: true });
    const force = h(
      "button",
      { type: "button", class: "danger", hidden: true, "aria-label": `Force promote of version ${v.version}` },
      "Force…",
    );
    const held = (error) => {
      if (error.code !== "evaluation_required") return false;
      refusal.textContent = error.message;
      refusal.hidden = false;
      force.hidden = false;
      return true;
    };
    promote.addEventListener("click", () => {
      refusal.hidden = true;
      force.hidden = true;
      act(`Serving version ${v.version}`, "POST", `/versions/${v.version}/promote`, undefined, undefined, held, policyTag);
    });
    force.addEventListener("click", async () => {
      const question =
        `Promote version ${v.version} without a passing evaluation? Every user gets it now, ` +
        "and the audit log records that the gate was skipped.";
      if (!(await confirmDialog(question, "Promote anyway"))) return;
      act(`Serving version ${v.version} (gate skipped)`, "POST", `/versions/${v.version}/promote`, undefined, {
        force: "true",
      }, undefined, policyTag);
    });
    return h("div", {}, h("div", { class: "row" }, promote, force), refusal);
  }

  // The attached evaluation (GET; 404: none) and its remove button.
  const latestGate = latestCall();
  async function loadGate() {
    const current = latestGate();
    let config;
    try {
      config = await api.call("GET", `${path}/evaluation`);
    } catch (error) {
      if (!alive() || !current()) return;
      if (error.status === 404) {
        fill(gate, h("p", { class: "muted", id: "evaluation-none" }, "No evaluation attached: staged versions are promoted without one."));
      } else fill(gate, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive() || !current()) return;
    const remove = h("button", { type: "button", class: "secondary" }, "Remove evaluation");
    remove.addEventListener("click", async () => {
      const question = `Remove the evaluation from ${name}? Staged versions can then be promoted without a result.`;
      if (!(await confirmDialog(question, "Remove"))) return;
      try {
        await api.call("DELETE", `${path}/evaluation`);
      } catch (error) {
        if (alive()) note.fail(error);
        return;
      }
      if (!alive()) return;
      note.say("Removed the evaluation.");
      loadGate();
    });
    fill(
      gate,
      h(
        "dl",
        { class: "row", id: "evaluation-config", "aria-label": "Attached evaluation" },
        h("div", {}, h("dt", {}, "File"), h("dd", {}, config.file_id)),
        h("div", {}, h("dt", {}, "Metric"), h("dd", {}, config.metric)),
        h("div", {}, h("dt", {}, "Margin"), h("dd", {}, String(config.margin))),
        h("div", {}, h("dt", {}, "Max tokens"), h("dd", {}, String(config.max_tokens))),
        h("div", {}, h("dt", {}, "Examples"), h("dd", {}, String(config.examples))),
        h("div", {}, h("dt", {}, "Attached"), h("dd", {}, when(config.updated_at))),
      ),
      remove,
    );
  }

  // Upload the file (purpose fine-tune), then attach it; a refused file is deleted again,
  // so a refusal stores nothing. A failure that is no refusal (no answer in time, a 502,
  // 503 or 504) keeps the file: the registry may have attached it.
  function attachForm() {
    const picker = h("input", {
      type: "file",
      name: "evaluation-file",
      accept: ".jsonl,application/jsonl",
      "aria-describedby": "evaluation-file-error",
    });
    const metric = h("select", { name: "evaluation-metric" }, METRICS.map((m) => h("option", { value: m.value }, m.label)));
    const margin = h("input", { type: "number", name: "evaluation-margin", min: "0", max: "1", step: "any", value: "0.05", required: true });
    const maxTokens = h("input", { type: "number", name: "evaluation-max-tokens", min: "1", max: "512", value: "64", required: true });
    metric.addEventListener("change", () => {
      margin.max = METRICS.find((m) => m.value === metric.value).maxMargin;
    });
    const progress = h("progress", { max: "100", value: "0", hidden: true, "aria-label": "Upload progress" });
    const submit = h("button", { type: "submit" }, "Attach evaluation");
    const error = h("p", { class: "error", role: "alert", id: "evaluation-file-error", hidden: true });
    const form = h(
      "form",
      { "aria-label": "Attach an evaluation" },
      h("div", { class: "row" }, field("Evaluation file (chat JSONL; each line ends with the expected answer)", picker)),
      h(
        "div",
        { class: "row" },
        field("Metric", metric),
        field("Margin", margin),
        field("Max tokens per answer", maxTokens),
        submit,
        progress,
      ),
    );
    const refuse = (text) => {
      error.textContent = text;
      error.hidden = false;
    };
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.hidden = true;
      const file = picker.files[0];
      if (!file) {
        refuse("Choose a JSONL file first.");
        return;
      }
      const body = new FormData();
      body.set("purpose", "fine-tune");
      body.set("file", file, file.name);
      submit.disabled = true;
      progress.hidden = false;
      try {
        let stored;
        try {
          stored = await api.upload("POST", "/v1/files", body, (loaded, total) => {
            progress.value = Math.round((100 * loaded) / total);
          });
        } catch (failure) {
          if (alive()) refuse(failure.message);
          return;
        }
        let config;
        try {
          config = await api.call("PUT", `${path}/evaluation`, {
            json: { file_id: stored.id, metric: metric.value, margin: Number(margin.value), max_tokens: Number(maxTokens.value) },
          });
        } catch (failure) {
          if (REFUSED.has(failure.status)) {
            api.call("DELETE", `/v1/files/${encodeURIComponent(stored.id)}`).catch(() => {});
            if (alive()) refuse(failure.message);
            return;
          }
          if (!alive()) return;
          refuse(
            `${failure.message.replace(/\.$/, "")}. The uploaded file ${stored.id} was kept: the evaluation may ` +
              "or may not have been attached to it (the gate above is read again).",
          );
          loadGate();
          return;
        }
        if (!alive()) return;
        note.say(`Attached ${file.name} (${config.examples} examples, ${config.metric}) as the evaluation.`);
        loadGate();
        load(); // results on another file or metric no longer open the gate
      } finally {
        submit.disabled = false;
        progress.hidden = true;
      }
    });
    return { form, error };
  }

  // Run the evaluation on a version (default: the newest staged one) and the serving one.
  let running = false;
  function drawRun(policy) {
    if (running) return; // keep the form that is waiting for its answer
    const version = h(
      "select",
      { name: "evaluation-version" },
      h("option", { value: "" }, "the newest staged version"),
      policy.versions
        .slice()
        .reverse()
        .map((v) => h("option", { value: String(v.version) }, `v${v.version} (${v.state})`)),
    );
    const promote = h("input", { type: "checkbox", name: "evaluation-promote" });
    const submit = h("button", { type: "submit" }, "Run evaluation");
    const form = h(
      "form",
      { class: "row", "aria-label": "Run the evaluation" },
      field("Version to evaluate", version),
      field("Promote it if it passes", promote, "inline"),
      submit,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const chosen = version.value ? Number(version.value) : undefined;
      runError.hidden = true;
      runOutcome.hidden = true;
      submit.disabled = true;
      running = true;
      form.setAttribute("aria-busy", "true");
      runBusy.textContent = `Evaluating ${chosen ? `v${chosen}` : "the newest staged version"} and v${policy.version}: every example is served to both, so this takes a while…`;
      runBusy.hidden = false;
      let answer;
      try {
        answer = await api.call("POST", `${path}/evaluations`, {
          json: { version: chosen, promote: promote.checked },
          timeout: RUN_TIMEOUT_MS,
        });
      } catch (failure) {
        if (alive()) {
          runError.textContent = failure.message;
          runError.hidden = false;
        }
        return;
      } finally {
        running = false;
        submit.disabled = false;
        form.removeAttribute("aria-busy");
        runBusy.hidden = true;
      }
      if (!alive()) return;
      const verdict = answer.promoted
        ? " Promoted: it serves every user now."
        : answer.promote_refused
          ? ` Not promoted: ${answer.promote_refused}`
          : promote.checked && !answer.result.passed
            ? " Not promoted."
            : "";
      fill(runOutcome, `v${answer.version}: `, evaluation(answer.result), verdict);
      runOutcome.hidden = false;
      load();
    });
    fill(run, form);
  }

  function drawSplit(policy, policyTag) {
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
      setSplit(policy, policyTag, "Setting the split", { version: Number(version.value), weight: Number(weight.value) });
    });
    const clear = h("button", { type: "button", class: "secondary", disabled: !policy.canary }, "Remove split");
    clear.addEventListener("click", () => setSplit(policy, policyTag, "Removing the split", null));
    fill(split, form, clear);
  }

  // The policy PUT names the serving version, and the registry serves whichever version it
  // names: sent with a version another tab or the CLI has since replaced, it would serve the
  // replaced one again. So the policy is read again first (a changed version is only
  // shown), and the PUT carries the tag of the policy the page showed: a split set or
  // removed elsewhere since then gets 412 from the registry instead of being overwritten.
  async function setSplit(shown, shownTag, label, canary) {
    note.say(`${label}…`);
    let current;
    try {
      current = await api.call("GET", `${path}/policy`);
    } catch (error) {
      if (alive()) note.fail(error);
      return;
    }
    if (!alive()) return;
    if (current.version !== shown.version) {
      note.fail(
        `The serving version changed to v${current.version} since this page loaded: the split ` +
          `was not changed. The page now shows v${current.version}; set the split again to apply it there.`,
      );
      load();
      return;
    }
    act(label, "PUT", "/policy", { version: shown.version, canary }, undefined, undefined, shownTag);
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
  const latestVersionUsage = latestCall();
  async function loadVersionUsage() {
    const chosen = WINDOWS.find((w) => w.value === windowSelect.value) || WINDOWS[1];
    const current = latestVersionUsage();
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
      if (alive() && current()) fill(perVersion, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive() || !current()) return;
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
  loadGate();
  loadVersionUsage();
  loadUsage();
}
