// Every page's script: a page the browser restores from its back/forward
// cache (the Back button) shows the shop as it was then, a cart with an
// item since bought, say; load it again from the shop instead.
"use strict";

window.addEventListener("pageshow", (ev) => {
  if (ev.persisted) window.location.reload();
});
