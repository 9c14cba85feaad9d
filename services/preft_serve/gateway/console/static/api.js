// The console's only way to the server: the same JSON routes the SDK calls, with the key
// as a bearer token. The key lives in this module's memory: never in a cookie or in
// storage, so a reload signs out and no other site's request can carry it.

let apiKey = null;
const TIMEOUT_MS = 30000; // a page shows an error rather than wait on a stalled call

export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function signIn(key) {
  apiKey = key;
}

export function signOut() {
  apiKey = null;
}

export function signedIn() {
  return apiKey !== null;
}

function headers(extra = {}) {
  return { Authorization: `Bearer ${apiKey}`, ...extra };
}

/** The server's own words for an error: OpenAI's envelope, FastAPI's detail, or the status. */
export function errorMessage(status, text) {
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return String(body.error.message);
    if (body && body.detail !== undefined) {
      return typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    }
  } catch {
    // not JSON: the text itself, cut short
  }
  return `HTTP ${status}: ${String(text).slice(0, 300) || "no answer"}`;
}

async function failure(response) {
  const text = await response.text();
  let code = null;
  try {
    code = JSON.parse(text).error.code;
  } catch {
    // no code
  }
  return new ApiError(response.status, errorMessage(response.status, text), code);
}

/** ``path`` with its query (undefined or empty values left out). */
export function url(path, query = {}) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined && value !== null && value !== "") params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

/**
 * A JSON call; the parsed answer (null for 204). Throws ApiError with the server's message.
 * ``timeout`` (ms) for the few calls that work for long by design (an evaluation run);
 * ``ifMatch``: change only what still carries this ETag (412 otherwise).
 */
export async function call(method, path, options = {}) {
  return (await answer(method, path, options)).body;
}

/** A JSON call's parsed answer with its headers (an ETag, a Link to the next page). */
export async function answer(method, path, { json, query, timeout = TIMEOUT_MS, ifMatch } = {}) {
  const init = { method, headers: headers(), signal: AbortSignal.timeout(timeout) };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  if (ifMatch) init.headers["If-Match"] = ifMatch;
  let response;
  try {
    response = await fetch(url(path, query), init);
  } catch (error) {
    throw new ApiError(0, `the gateway did not answer: ${error.message}`, null);
  }
  if (!response.ok) throw await failure(response);
  const body = response.status === 204 ? null : await response.json();
  return { body, headers: response.headers };
}

/** The ``rel="next"`` URL of a ``Link`` header (RFC 8288), or null. */
export function nextLink(header) {
  const found = /<([^>]*)>\s*;\s*rel="?next"?/.exec(header || "");
  return found ? found[1] : null;
}

/** The raw answer of a GET (a CSV or archive download), as text. */
export async function text(path, query) {
  const response = await fetch(url(path, query), {
    headers: headers(),
    signal: AbortSignal.timeout(TIMEOUT_MS),
  });
  if (!response.ok) throw await failure(response);
  return response.text();
}

/** A multipart upload with progress (fetch reports none for request bodies, XHR does). */
export function upload(method, path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, path);
    xhr.setRequestHeader("Authorization", `Bearer ${apiKey}`);
    xhr.upload.addEventListener("progress", (event) => {
      if (event.lengthComputable) onProgress(event.loaded, event.total);
    });
    xhr.addEventListener("load", () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText || "null"));
      else reject(new ApiError(xhr.status, errorMessage(xhr.status, xhr.responseText), null));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "the upload failed: no answer", null)));
    xhr.send(form);
  });
}

/**
 * A streamed chat completion: ``onHeaders(headers)`` once, ``onDelta(text)`` per piece,
 * the final usage (when sent) returned. Server-sent events read from fetch's body stream.
 */
export async function streamChat(body, { onHeaders, onDelta, signal, user }) {
  const stream = { ...body, stream: true, stream_options: { include_usage: true } };
  const response = await openStream("/v1/chat/completions", stream, { onHeaders, signal, user });
  let usage = null;
  for await (const data of sseData(response)) {
    if (data === "[DONE]") continue;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new ApiError(502, String(chunk.error.message), chunk.error.code);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const piece = choice.delta && choice.delta.content;
      if (piece) onDelta(piece);
    }
  }
  return usage;
}

/**
 * A streamed Responses call (``POST /v1/responses``, stream=true): ``onHeaders(headers)``
 * once, ``onDelta(text)`` per ``response.output_text.delta`` event, the final response's
 * usage (``input_tokens``, ``output_tokens``; from ``response.completed``) returned. A
 * ``response.failed`` or ``error`` event throws with its message.
 */
export async function streamResponses(body, { onHeaders, onDelta, signal, user }) {
  const stream = { ...body, stream: true };
  const response = await openStream("/v1/responses", stream, { onHeaders, signal, user });
  let usage = null;
  for await (const data of sseData(response)) {
    if (data === "[DONE]") continue;
    const event = JSON.parse(data);
    if (event.type === "response.output_text.delta" && event.delta) onDelta(event.delta);
    else if (event.type === "response.completed" || event.type === "response.incomplete") {
      if (event.response && event.response.usage) usage = event.response.usage;
    } else if (event.type === "response.failed" || event.type === "error" || event.error) {
      const failed = (event.response && event.response.error) || event.error || event;
      throw new ApiError(502, String(failed.message || "the response failed"), failed.code || null);
    }
  }
  return usage;
}

/** POST a streamed request; ``onHeaders(headers)`` once; an error answer throws. */
async function openStream(path, body, { onHeaders, signal, user }) {
  const extra = { "Content-Type": "application/json" };
  if (user) extra["X-User-Id"] = user;
  const response = await fetch(path, {
    method: "POST",
    headers: headers(extra),
    body: JSON.stringify(body),
    signal,
  });
  onHeaders(response.headers);
  if (!response.ok) throw await failure(response);
  return response;
}

/** The ``data:`` payload of each server-sent event of ``response`` (its lines joined). */
async function* sseData(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += value;
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const block = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      const data = block
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trim())
        .join("\n");
      if (data) yield data;
    }
  }
}
