// gpufleet web UI: live refresh. Every few seconds, fetch the current page's live part from the controller
// (header X-Gpufleet-Fragment: 1) and put it in place. No library, nothing from another origin.
// It pauses while the tab is hidden and while someone is filling in a form on the page.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var stamp = document.getElementById("stamp");
  if (!live) { return; }
  var every = parseInt(live.getAttribute("data-every") || "0", 10);
  if (!(every > 0)) { return; }
  var busy = false;
  var editing = false;
  live.addEventListener("input", function () { editing = true; });
  live.addEventListener("change", function () { editing = true; });

  function focused() {
    var a = document.activeElement;
    return a && live.contains(a) && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
  }

  function mark(text, stale) {
    if (!stamp) { return; }
    stamp.textContent = text;
    stamp.className = stale ? "stale" : "muted";
  }

  function refresh() {
    if (busy || editing || document.hidden || focused()) { return; }
    busy = true;
    fetch(window.location.pathname + window.location.search, {
      headers: { "X-Gpufleet-Fragment": "1" }, credentials: "same-origin", cache: "no-store"
    }).then(function (r) {
      if (r.status === 401) { window.location.reload(); return null; }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.text();
    }).then(function (html) {
      if (html === null) { return; }
      live.innerHTML = html;
      live.setAttribute("data-refreshed", String(Date.now()));
      mark("updated " + new Date().toLocaleTimeString(), false);
    }).catch(function (err) {
      mark("not updated: " + err.message + " (retrying)", true);
    }).then(function () { busy = false; });
  }

  window.setInterval(refresh, every * 1000);
}());
