// Playground: one prompt streamed to an adapter (or a user's binding) and to the base
// model side by side, each answer with the x-preft-adapter* headers that say what ran;
// through chat completions or the Responses API (a switch).

import * as api from "../api.js";
import { h, fill, field, notices } from "../dom.js";

const FACTS = ["x-preft-adapter", "x-preft-adapter-version", "x-preft-adapter-sha256", "x-request-id"];

function pane(id, title) {
  const answer = h("div", { class: "answer", "aria-live": "polite" });
  const facts = h("dl", { class: "facts" });
  const error = h("p", { class: "error", role: "alert" });
  const heading = h("h2", { id }, title);
  const node = h("section", { class: "pane", "aria-labelledby": id }, heading, answer, facts, error);
  return { node, heading, answer, facts, error };
}

export function render(view, _params, alive) {
  const note = notices();
  let base = null;
  const model = h("select", { name: "model" }, h("option", { value: "" }, "Loading models…"));
  const user = h("input", { name: "user", autocomplete: "off", maxlength: "128" });
  const prompt = h("textarea", { name: "prompt", required: true, rows: "3" }, "Say something.");
  const maxTokens = h("input", { type: "number", name: "max-tokens", min: "1", max: "512", value: "32" });
  const extra = h("input", { name: "extra", autocomplete: "off", value: "{}", spellcheck: "false" });
  const send = h("button", { type: "submit" }, "Send");
  const chatApi = h("input", { type: "radio", name: "api", value: "chat", checked: true });
  const responsesApi = h("input", { type: "radio", name: "api", value: "responses" });
  const apiSwitch = h(
    "fieldset",
    { class: "row" },
    h("legend", {}, "API"),
    field("Chat completions", chatApi),
    field("Responses", responsesApi),
  );
  const left = pane("pane-adapter", "With the adapter");
  const right = pane("pane-base", "Base model");
  const form = h(
    "form",
    { "aria-label": "Chat" },
    apiSwitch,
    h(
      "div",
      { class: "row" },
      field("Adapter", model),
      field("or as user (their binding)", user),
      field("Max tokens", maxTokens),
      field("More parameters (JSON object)", extra),
    ),
    field("Message", prompt),
    h("div", { class: "row" }, send),
  );
  fill(view, h("h1", {}, "Playground"), form, ...note.nodes, h("div", { class: "panes" }, left.node, right.node));

  async function run(target, body, who, responses) {
    fill(target.answer);
    fill(target.facts);
    target.error.textContent = "";
    const started = performance.now();
    let first = null;
    let pieces = 0;
    try {
      const stream = responses ? api.streamResponses : api.streamChat;
      const usage = await stream(body, {
        user: who,
        onHeaders(headers) {
          for (const name of FACTS) {
            const value = headers.get(name);
            if (value !== null) target.facts.append(h("dt", {}, name), h("dd", {}, value));
          }
        },
        onDelta(piece) {
          if (first === null) first = performance.now() - started;
          pieces += 1;
          target.answer.append(piece);
        },
      });
      const parts = [`first token after ${first === null ? "-" : Math.round(first)} ms`, `${pieces} pieces`];
      if (usage && responses) parts.push(`${usage.input_tokens} input + ${usage.output_tokens} output tokens`);
      else if (usage) parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
      target.facts.append(h("dt", {}, "stream"), h("dd", { class: "stream-done" }, parts.join(", ")));
    } catch (error) {
      target.error.textContent = error.message;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!base) return;
    let more;
    try {
      more = JSON.parse(extra.value || "{}");
      if (typeof more !== "object" || more === null || Array.isArray(more)) throw new Error("not an object");
    } catch (error) {
      note.fail(`More parameters must be a JSON object, such as {"seed": 1}: ${error.message}`);
      return;
    }
    note.clear();
    const responses = responsesApi.checked;
    const common = responses
      ? { temperature: 0, ...more, input: prompt.value, max_output_tokens: Number(maxTokens.value) }
      : {
          temperature: 0,
          ...more,
          messages: [{ role: "user", content: prompt.value }],
          max_tokens: Number(maxTokens.value),
        };
    const who = user.value.trim();
    const chosen = who ? base : model.value;
    send.disabled = true;
    await Promise.all([
      run(left, { ...common, model: chosen, ...(who ? { user: who } : {}) }, null, responses),
      run(right, { ...common, model: base }, null, responses),
    ]);
    send.disabled = false;
  });

  (async () => {
    let models;
    try {
      models = await api.call("GET", "/v1/models");
    } catch (error) {
      if (alive()) note.fail(error);
      return;
    }
    if (!alive()) return;
    const baseModel = models.data.at(-1); // the base model comes last (a tenant may be named preft-serve)
    base = baseModel.id;
    right.heading.textContent = `Base model (${base})`;
    fill(
      model,
      models.data.filter((m) => m.id !== base).map((m) => h("option", { value: m.id }, m.id)),
      h("option", { value: base }, `${base} (base model)`),
    );
  })();
}
