// Fine-tuning: upload a training file (the registry names every bad line), create a job,
// follow it (status, a loss chart from its metrics events), cancel it, and read its result:
// the trained adapter, its checkpoint and the per-step metrics file.

import * as api from "../api.js";
import { h, fill, field, table, notices, confirmDialog, saveFile, when, refusedLink } from "../dom.js";
import { lineChart } from "../charts.js";

const POLL_MS = 1500;
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

// The registry's job ids: only such an id goes into a request path.
const JOB_ID = /^ftjob-[A-Za-z0-9]{24}$/;

export function render(view, [jobId], alive) {
  if (jobId && !JOB_ID.test(jobId)) {
    const rule = "job ids are 'ftjob-' and 24 letters or digits.";
    refusedLink(view, "Fine-tuning", `That is not a job id: ${rule}`, "#/fine-tuning", "All jobs");
  } else if (jobId) job(view, jobId, alive);
  else overview(view, alive);
}

function overview(view, alive) {
  const note = notices();
  const picker = h("input", { type: "file", name: "training-file", accept: ".jsonl,application/jsonl" });
  const progress = h("progress", { max: "100", value: "0", hidden: true, "aria-label": "Upload progress" });
  const fileError = h("p", { class: "error", role: "alert", id: "training-file-error" });
  const upload = h(
    "form",
    { class: "row", "aria-label": "Upload a training file" },
    field("Training file (JSONL)", picker),
    h("button", { type: "submit" }, "Upload file"),
    progress,
  );
  const files = h("div", {}, h("p", { class: "loading" }, "Loading files…"));
  const training = h("select", { name: "training-file-id", required: true });
  const model = h("input", { name: "base-model", required: true, autocomplete: "off" });
  const suffix = h("input", { name: "suffix", required: true, autocomplete: "off", maxlength: "64" });
  const kind = h("select", { name: "adapter-kind" }, ["lora", "direft", "loreft"].map((k) => h("option", { value: k }, k)));
  const mode = h("select", { name: "job-mode" }, h("option", { value: "prefill" }, "prefill"), h("option", { value: "all" }, "all"));
  const rank = h("input", { type: "number", name: "rank", min: "1", max: "64", value: "4" });
  const steps = h("input", { type: "number", name: "steps", min: "1", value: "20" });
  const create = h(
    "form",
    { "aria-label": "Create a job" },
    h(
      "div",
      { class: "row" },
      field("Training file", training),
      field("Base model", model),
      field("Adapter name (suffix)", suffix),
    ),
    h(
      "div",
      { class: "row" },
      field("Adapter type", kind),
      field("Mode", mode),
      field("Rank", rank),
      field("Steps", steps),
      h("button", { type: "submit" }, "Create job"),
    ),
  );
  const jobs = h("div", {}, h("p", { class: "loading" }, "Loading jobs…"));
  fill(
    view,
    h("h1", {}, "Fine-tuning"),
    h("h2", {}, "Training files"),
    upload,
    fileError,
    files,
    h("h2", {}, "New job"),
    create,
    ...note.nodes,
    h("h2", {}, "Jobs"),
    jobs,
  );

  upload.addEventListener("submit", async (event) => {
    event.preventDefault();
    fileError.textContent = "";
    const file = picker.files[0];
    if (!file) {
      fileError.textContent = "Choose a JSONL file first.";
      return;
    }
    const body = new FormData();
    body.set("purpose", "fine-tune");
    body.set("file", file, file.name);
    progress.hidden = false;
    try {
      const stored = await api.upload("POST", "/v1/files", body, (loaded, total) => {
        progress.value = Math.round((100 * loaded) / total);
      });
      note.say(`Stored ${stored.filename} as ${stored.id}.`);
      loadFiles(stored.id);
    } catch (error) {
      // Every bad line, as the registry names them.
      fileError.textContent = error.message;
    } finally {
      progress.hidden = true;
    }
  });

  create.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {
      model: model.value.trim(),
      training_file: training.value,
      suffix: suffix.value.trim(),
      method: {
        type: "preft",
        preft: { adapter: kind.value, mode: mode.value, rank: Number(rank.value), steps: Number(steps.value) },
      },
    };
    let created;
    try {
      created = await api.call("POST", "/v1/fine_tuning/jobs", { json: body });
    } catch (error) {
      note.fail(error);
      return;
    }
    location.hash = `#/fine-tuning/${encodeURIComponent(created.id)}`;
  });

  async function loadFiles(select) {
    let list;
    try {
      list = await api.call("GET", "/v1/files", { query: { purpose: "fine-tune", limit: 100 } });
    } catch (error) {
      if (alive()) fill(files, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive()) return;
    fill(
      files,
      list.data.length
        ? table(null, ["File", "Name", "Bytes", "Uploaded"], list.data.map((f) => [f.id, f.filename, String(f.bytes), when(new Date(f.created_at * 1000).toISOString())]))
        : h("p", { class: "muted" }, "No training files yet."),
    );
    fill(training, list.data.map((f) => h("option", { value: f.id, selected: f.id === select }, `${f.filename} (${f.id})`)));
  }
  async function loadJobs() {
    let list;
    try {
      list = await api.call("GET", "/v1/fine_tuning/jobs", { query: { limit: 20 } });
    } catch (error) {
      if (alive()) fill(jobs, h("p", { class: "error", role: "alert" }, error.message));
      return;
    }
    if (!alive()) return;
    fill(
      jobs,
      list.data.length
        ? table(null, ["Job", "Status", "Adapter", "Created"], list.data.map((j) => [
            h("a", { href: `#/fine-tuning/${encodeURIComponent(j.id)}` }, j.id),
            j.status,
            j.fine_tuned_model || "",
            when(new Date(j.created_at * 1000).toISOString()),
          ]))
        : h("p", { class: "muted" }, "No jobs yet."),
    );
  }
  async function loadBase() {
    try {
      const models = await api.call("GET", "/v1/models");
      const base = models.data.at(-1); // the base model comes last (a tenant may be named preft-serve)
      if (alive() && base && !model.value) model.value = base.id;
    } catch {
      // typed by hand then
    }
  }
  loadFiles(null);
  loadJobs();
  loadBase();
}

function job(view, jobId, alive) {
  const path = `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}`;
  const note = notices();
  const status = h("p", { class: "job-status", role: "status" }, "Loading the job…");
  const chart = h("div", { class: "loss" });
  const result = h("div");
  const events = h("div");
  const cancel = h("button", { type: "button", class: "danger", disabled: true }, "Cancel job");
  fill(
    view,
    h("p", {}, h("a", { href: "#/fine-tuning" }, "← Fine-tuning")),
    h("h1", {}, "Job ", jobId),
    status,
    cancel,
    ...note.nodes,
    h("h2", {}, "Training loss"),
    chart,
    h("h2", {}, "Result"),
    result,
    h("h2", {}, "Events"),
    events,
  );
  cancel.addEventListener("click", async () => {
    if (!(await confirmDialog(`Cancel job ${jobId}?`, "Cancel job"))) return;
    try {
      await api.call("POST", `${path}/cancel`);
      note.say("Cancelling…");
    } catch (error) {
      note.fail(error);
    }
  });

  async function showResult(state) {
    const parts = [];
    if (state.fine_tuned_model) {
      parts.push(h("p", {}, "Adapter: ", h("a", { href: `#/adapters/${encodeURIComponent(state.fine_tuned_model)}` }, state.fine_tuned_model)));
    }
    if (state.error && state.error.message) parts.push(h("p", { class: "error" }, state.error.message));
    try {
      const checkpoints = await api.call("GET", `${path}/checkpoints`);
      if (checkpoints.data.length) {
        parts.push(
          table(null, ["Checkpoint", "Step", "Train loss"], checkpoints.data.map((c) => [
            c.fine_tuned_model_checkpoint,
            String(c.step_number),
            c.metrics && c.metrics.train_loss !== undefined && c.metrics.train_loss !== null ? String(c.metrics.train_loss) : "",
          ])),
        );
      }
    } catch (error) {
      parts.push(h("p", { class: "error" }, error.message));
    }
    for (const id of state.result_files || []) {
      const link = h("button", { type: "button", class: "secondary" }, `Download ${id} (per-step metrics CSV)`);
      link.addEventListener("click", async () => {
        try {
          saveFile(`${id}.csv`, await api.text(`/v1/files/${encodeURIComponent(id)}/content`));
        } catch (error) {
          note.fail(error);
        }
      });
      parts.push(link);
    }
    if (alive()) fill(result, ...parts);
  }

  async function poll() {
    let state;
    let page;
    try {
      [state, page] = await Promise.all([
        api.call("GET", path),
        api.call("GET", `${path}/events`, { query: { limit: 100 } }),
      ]);
    } catch (error) {
      if (alive()) note.fail(error);
      if (alive()) setTimeout(poll, POLL_MS * 2);
      return;
    }
    if (!alive()) return;
    const finished = FINISHED.has(state.status);
    status.textContent = `Status: ${state.status}` + (state.estimated_finish ? `, done about ${when(new Date(state.estimated_finish * 1000).toISOString())}` : "");
    cancel.disabled = finished;
    const ordered = page.data.slice().reverse(); // the API lists newest first
    const points = ordered
      .filter((e) => e.type === "metrics" && e.data && typeof e.data.train_loss === "number")
      .map((e) => ({ x: e.data.step, y: e.data.train_loss }));
    fill(chart, points.length ? lineChart("Training loss by step", points) : h("p", { class: "muted" }, "No loss reported yet."));
    chart.dataset.points = String(points.length);
    fill(events, table(null, ["Time", "Level", "Message"], ordered.map((e) => [when(new Date(e.created_at * 1000).toISOString()), e.level, e.message])));
    if (finished) showResult(state);
    else setTimeout(poll, POLL_MS);
  }
  poll();
}
