// The checkout page's script: one Idempotency-Key per purchase.
//
// The storefront keeps the session's one open purchase (its key, and from
// its first Pay its whole request: items, email, card) until its final
// answer, and the page starts from it (data-state): a reload, a second
// tab, the Back button, or a tab opened again after one closed during Pay
// all show the same purchase, and Pay sends the same key. Making a key per
// click, per page load or per tab would turn each of those into a second
// order and a second charge.
//
// The purchase is defined at its first Pay: the form is then locked, and
// every Pay sends that request, byte for byte. A retry with other details
// would be refused by the API (422) while the first request may still be
// charged. The page also keeps the request in sessionStorage: a storefront
// restarted during Pay forgot it, and adopts the page's at the next Pay,
// under the same API key. The page gives it back only then (the server
// says it forgot the session's purchases): a stored request of a purchase
// that is not the server's current one (bought from another tab since) is
// out of date, and sending it again could buy it twice.
"use strict";

const STORE = "storefront.purchase";
const NOTICE = "storefront.notice"; // why the page reloaded, shown after it
const $ = (id) => document.getElementById(id);
const state = JSON.parse($("pay-form").dataset.state || "{}");

function load() {
  try { return JSON.parse(sessionStorage.getItem(STORE)); } catch { return null; }
}

// fromServer is the page's purchase for the server's.
function fromServer(p) {
  return { key: p.key, request: p.request, apiKey: p.api_key || "", attempts: p.attempts || [] };
}

// purchase is {key, request, apiKey, attempts: [{pay, n, status, code, replayed, error, trace_url}]}.
let purchase = fromServer(state.open);
const stored = load();
if (state.forgotten && !state.open.request && stored && stored.request) {
  // The storefront restarted since this tab's first Pay: its request is
  // the purchase, which the next Pay gives back to the storefront. Any
  // other stored request is of a purchase that is over or superseded:
  // save() below replaces it with the server's current purchase.
  purchase = stored;
}
let open = true;   // false once a final answer came
let inFlight = 0;  // Pays waiting for the shop's answer
let last = null;   // the final answer, acted on when nothing is in flight

function save() {
  if (open) sessionStorage.setItem(STORE, JSON.stringify(purchase));
}

// merge adds the server's attempts to the panel's, once each.
function merge(attempts) {
  const seen = new Set(purchase.attempts.map((a) => a.pay + "/" + a.n));
  for (const a of attempts || []) {
    if (!seen.has(a.pay + "/" + a.n)) purchase.attempts.push(a);
  }
  purchase.attempts.sort((a, b) => a.pay - b.pay || a.n - b.n);
}

function answerText(a) {
  if (!a.status) return "no answer (" + (a.error || "lost") + ")";
  return a.status + (a.code ? " " + a.code : "");
}

// lock shows the stored request in the form and freezes it while the
// purchase is open, and hides the button that would start another one.
function lock() {
  if (!purchase.request || !open) return;
  $("email").value = purchase.request.email;
  $("payment-method").value = purchase.request.payment_method;
  $("email").disabled = $("payment-method").disabled = true;
  $("locked").hidden = false;
  $("new-purchase").hidden = true;
}

// unlock opens the form for a purchase with nothing sent under its key.
function unlock() {
  purchase.request = null;
  $("email").disabled = $("payment-method").disabled = false;
  $("locked").hidden = true;
  $("new-purchase").hidden = false;
}

function render() {
  lock();
  $("browser-key").textContent = purchase.key;
  $("api-key").textContent = purchase.apiKey || "not sent yet";
  const body = $("attempts").querySelector("tbody");
  body.replaceChildren(...purchase.attempts.map((a) => {
    const tr = document.createElement("tr");
    tr.className = "attempt s" + (a.status ? Math.floor(a.status / 100) + "xx" : "0");
    for (const text of ["#" + a.pay, a.n, answerText(a), a.status ? (a.replayed ? "yes" : "no") : "–"]) {
      const td = document.createElement("td");
      td.textContent = text;
      tr.append(td);
    }
    if (a.trace_url) {
      // The Pay's trace (TRACE_UI_URL): the click, the API and, later, the email.
      const link = document.createElement("a");
      link.href = a.trace_url;
      link.target = "_blank";
      link.className = "trace-link";
      link.textContent = "#" + a.pay;
      tr.firstChild.replaceChildren(link);
    }
    tr.dataset.status = a.status;
    tr.dataset.replayed = a.replayed;
    return tr;
  }));
}

function show(text, link, id) {
  const result = $(id || "result");
  result.textContent = text + " ";
  if (link) {
    const a = document.createElement("a");
    a.href = link;
    a.id = id === "last-purchase" ? "last-order-link" : "order-link";
    a.textContent = "View your order";
    result.append(a);
  }
}

// next starts a new purchase after a failed one: the server's new key,
// the form open again with the same email, for another card.
async function next() {
  try {
    const res = await fetch("/checkout/purchase");
    const v = await res.json();
    purchase = fromServer(v.open);
    open = true;
    last = null;
    unlock();
    save();
    render();
  } catch {
    // The shop did not answer: a reload starts the new purchase.
  }
}

// finish acts on the final answer once every Pay of the purchase has been
// answered, so that the panel shows them all (a double click's replay).
function finish() {
  if (inFlight > 0 || !last) return;
  if (last.outcome === "requires_action") {
    window.location.assign(last.order_url);
    return;
  }
  show(last.message, last.order_url);
  if (last.outcome === "failed") next();
}

// conclude takes the final answer of the purchase.
function conclude(out) {
  open = false;
  last = last || out;
  sessionStorage.removeItem(STORE);
}

$("pay-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  if (!open) { finish(); return; }
  if (!purchase.request) {
    const items = JSON.parse($("pay-form").dataset.items || "[]");
    if (items.length === 0) { show("Your cart is empty."); return; }
    purchase.request = { key: purchase.key, items, email: $("email").value, payment_method: $("payment-method").value };
    render();
  }
  save();
  inFlight++;
  show("Paying…");
  let out;
  try {
    const res = await fetch("/checkout", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(purchase.request),
    });
    out = await res.json();
  } catch (err) {
    out = { outcome: "unknown", message: "No answer from the shop. Press Pay again: it is safe.", attempts: [] };
  }
  inFlight--;
  if (out.key && out.key !== purchase.key) {
    // The page is out of date (outcome "stale"): its purchase is over or
    // another one was started since it loaded. Nothing was sent; show the
    // current purchase, and say why.
    sessionStorage.removeItem(STORE);
    if (out.message) sessionStorage.setItem(NOTICE, out.message);
    window.location.reload();
    return;
  }
  merge(out.attempts);
  if (out.api_key) purchase.apiKey = out.api_key;
  if (out.outcome === "invalid" && inFlight === 0) unlock();
  save();
  if (out.final) conclude(out);
  render();
  if (last) finish(); else show(out.message);
});

$("new-purchase").addEventListener("click", () => {
  sessionStorage.removeItem(STORE);
  window.location.reload();
});

// watch follows a purchase whose call to the API runs without this page
// (its tab closed or reloaded during Pay) until the call ends.
async function watch() {
  if (inFlight > 0 || !open) return;
  try {
    const res = await fetch("/checkout/purchase");
    const v = await res.json();
    if (v.last && v.last.key === purchase.key && v.last.result) {
      merge(v.last.attempts);
      conclude(v.last.result);
      render();
      finish();
      return;
    }
    if (v.open.key === purchase.key) {
      merge(v.open.attempts);
      render();
      if (v.open.in_flight > 0) { setTimeout(watch, 1000); return; }
      show("No final answer yet: press Pay again, it is safe (the same key, the same purchase).");
    }
  } catch {
    setTimeout(watch, 1000);
  }
}

if (state.last && state.last.result && !purchase.request) {
  show("Your last purchase: " + state.last.result.message, state.last.result.order_url, "last-purchase");
}
const notice = sessionStorage.getItem(NOTICE);
if (notice) {
  sessionStorage.removeItem(NOTICE);
  show(notice);
}
if (state.open.in_flight > 0 && state.open.key === purchase.key) {
  show("Your payment is being processed…");
  setTimeout(watch, 1000);
}
save();
render();
