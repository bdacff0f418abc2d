// The checkout page's script: one Idempotency-Key per purchase.
//
// The key is made here, when the form is shown, and kept in sessionStorage
// (this tab only) until a final answer. Every Pay of the purchase sends it:
// a double click, a Pay after a reload, a Pay after an answer that never
// came. Making a key per click, or per page load, would turn each of those
// into a second order and a second charge.
//
// The purchase is defined at its first Pay: the page stores the whole
// request (key, items, email, card) with the key and locks the form, and
// every Pay sends that stored request, byte for byte. A retry with other
// details would be refused by the API (422) while the first request may
// still be charged; and the storefront keeps nothing of the purchase in
// memory, so a retry after its restart is answered from this request.
"use strict";

const STORE = "storefront.purchase";
const $ = (id) => document.getElementById(id);

function load() {
  try { return JSON.parse(sessionStorage.getItem(STORE)); } catch { return null; }
}

// purchase is {key, request, pays, apiKey, attempts: [{pay, trace, n, status, code, replayed, error}]};
// request is the body of every Pay, set at the first one.
let purchase = load();
if (!purchase || !purchase.key) {
  purchase = { key: crypto.randomUUID(), request: null, pays: 0, apiKey: "", attempts: [] };
  sessionStorage.setItem(STORE, JSON.stringify(purchase));
}
let open = true;   // false once a final answer came: the key is forgotten
let inFlight = 0;  // Pays waiting for the shop's answer
let last = null;   // the final answer, acted on when nothing is in flight

function save() {
  if (open) sessionStorage.setItem(STORE, JSON.stringify(purchase));
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

// unlock opens the form again after an "invalid" answer: the API executes
// nothing it finds invalid, and every Pay sent the same body, so nothing
// was done under the key yet; the fixed request is stored at the next Pay.
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
    if (a.trace) {
      // The Pay's trace (TRACE_UI_URL): the click, the API and, later, the email.
      const link = document.createElement("a");
      link.href = a.trace;
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

function show(text, link) {
  const result = $("result");
  result.textContent = text + " ";
  if (link) {
    const a = document.createElement("a");
    a.href = link;
    a.id = "order-link";
    a.textContent = "View your order";
    result.append(a);
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
  const pay = ++purchase.pays;
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
  for (const a of out.attempts || []) purchase.attempts.push({ pay, trace: out.trace_url, ...a });
  if (out.api_key) purchase.apiKey = out.api_key;
  if (out.outcome === "invalid" && inFlight === 0) unlock();
  save();
  if (out.final) {
    // A final answer ends the purchase: forget its key, so that the next
    // purchase gets its own.
    open = false;
    last = last || out;
    sessionStorage.removeItem(STORE);
  }
  render();
  if (last) finish(); else show(out.message);
});

$("new-purchase").addEventListener("click", () => {
  sessionStorage.removeItem(STORE);
  window.location.reload();
});

render();
