// The console's shell: sign in and out, and a hash router that renders one page at a time.
// A page draws its frame at once and fills it as its calls answer, so none waits on a
// slow API; navigating away abandons the old page's late answers.

import * as api from "./api.js";
import { h, fill, field, notices } from "./dom.js";
import * as adapters from "./pages/adapters.js";
import * as upload from "./pages/upload.js";
import * as users from "./pages/users.js";
import * as playground from "./pages/playground.js";
import * as usage from "./pages/usage.js";
import * as keys from "./pages/keys.js";
import * as audit from "./pages/audit.js";
import * as finetune from "./pages/finetune.js";
import * as operator from "./pages/operator.js";

const PAGES = { adapters, upload, users, playground, usage, keys, audit, "fine-tuning": finetune };
const view = document.getElementById("view");
const nav = document.getElementById("nav");
// The operator's one page, signed in with the admin token: the tenant pages are hidden then
// (their routes take a tenant's key), and this link is hidden for a tenant's key.
const operatorLink = h("a", { href: "#/operator", hidden: true }, "Operator");
nav.insertBefore(operatorLink, document.getElementById("sign-out"));
let generation = 0;
let operatorMode = false;

/** Show the links of the signed-in kind: the operator's, or a tenant's. */
function showLinks() {
  for (const link of nav.querySelectorAll("a")) link.hidden = (link === operatorLink) !== operatorMode;
}

/** Which kind of secret was signed in with: "tenant" (an API key), "operator" (the admin token); or
 * the tenant check's refusal is thrown when it is neither. */
async function kindOf() {
  try {
    await api.call("GET", "/v1/models");
    return "tenant";
  } catch (refused) {
    if (refused.status !== 401) throw refused;
    try {
      await api.call("GET", "/v1/operator/routing");
    } catch {
      throw refused; // not the admin token either: the tenant check's words
    }
    return "operator";
  }
}

/** Whether the page rendered by generation ``token`` is still the one shown. */
export function current(token) {
  return token === generation;
}

function signInPage() {
  const input = h("input", {
    type: "password",
    name: "api-key",
    autocomplete: "off",
    required: true,
    spellcheck: "false",
  });
  const note = notices();
  const form = h(
    "form",
    { class: "row", "aria-label": "Sign in" },
    field("API key", input),
    h("button", { type: "submit" }, "Sign in"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    note.say("Checking the key…");
    api.signIn(input.value.trim());
    try {
      operatorMode = (await kindOf()) === "operator";
    } catch (error) {
      api.signOut();
      note.fail(error);
      return;
    }
    input.value = "";
    nav.hidden = false;
    showLinks();
    const home = operatorMode ? "#/operator" : "#/adapters";
    if (!location.hash || location.hash === "#/signin") location.hash = home;
    else route();
  });
  fill(
    view,
    h("h1", {}, "Sign in"),
    h(
      "p",
      { class: "muted" },
      "Your tenant API key is kept in this page's memory only: reloading or closing the page signs you out.",
    ),
    h("p", { class: "muted" }, "Operators: sign in with the deployment's admin token for the operator view."),
    form,
    ...note.nodes,
  );
  input.focus();
}

function route() {
  generation += 1;
  const token = generation;
  if (!api.signedIn()) {
    nav.hidden = true;
    signInPage();
    return;
  }
  let [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  if (operatorMode) name = "operator";
  else if (!Object.hasOwn(PAGES, name)) name = "adapters";
  const page = operatorMode ? operator : PAGES[name];
  for (const link of nav.querySelectorAll("a")) {
    link.toggleAttribute("aria-current", link.getAttribute("href") === `#/${name}`);
    if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
  }
  fill(view);
  page.render(view, rest.map(decoded), () => current(token));
  view.focus({ preventScroll: true });
}

// A hash segment as typed: a malformed escape (%E0) is kept as it is, not a thrown error.
function decoded(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

document.getElementById("sign-out").addEventListener("click", () => {
  api.signOut();
  operatorMode = false;
  location.hash = "#/signin";
  route();
});
window.addEventListener("hashchange", route);
route();
