// The order page's script: follows the order until it settles (and, once
// paid, until its email is sent), polling the storefront every second.
// The storefront says the status and the reason in words (orderView).
"use strict";

const $ = (id) => document.getElementById(id);
const id = $("order-id").textContent;
const started = Date.now();

async function poll() {
  try {
    const res = await fetch("/orders/" + encodeURIComponent(id) + "/status");
    if (res.ok) {
      const v = await res.json();
      $("order-status").textContent = v.status_text;
      $("order-status").dataset.status = v.status;
      $("order-status").dataset.settled = v.settled;
      $("reason").textContent = v.reason || "";
      $("reason").hidden = !v.reason;
      $("waiting").hidden = !v.waiting;
      if (v.redirect_url) $("authenticate").href = v.redirect_url;
      if (v.email_sent) $("email").textContent = "Confirmation email sent to " + v.order.email + ".";
      if (v.settled) $("following").textContent = "";
      const done = v.settled && (v.status !== "paid" || v.email_sent);
      if (done) return;
    }
  } catch (err) {
    // The shop did not answer; try again.
  }
  if (Date.now() - started < 5 * 60 * 1000) setTimeout(poll, 1000);
}

poll();
