// Every page: an id's copy button (shown only where this script runs) copies the whole id.
(function () {
  "use strict";
  document.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
    button.hidden = false;
    button.addEventListener("click", function () {
      var done = function (text) {
        button.textContent = text;
        setTimeout(function () { button.textContent = "copy"; }, 1500);
      };
      navigator.clipboard.writeText(button.getAttribute("data-copy"))
        .then(function () { done("copied"); }, function () { done("not copied"); });
    });
  });
})();

// The console's live pages: while "live" is on, the page asks the server for its numbers
// every two seconds and puts each one where its element says (data-live="key"), and each
// chart's lines (data-chart="queue"). No page reload; "Stop updating" stops asking.
(function () {
  "use strict";
  var root = document.querySelector("[data-live-url]");
  if (!root) { return; }
  var url = root.getAttribute("data-live-url");
  var toggle = document.querySelector("[data-live-toggle]");
  var status = document.querySelector("[data-live-status]");
  var bar = document.querySelector(".live-bar");
  if (bar) { bar.hidden = false; }  // without this script the page is as it was drawn
  var live = true;
  var timer = null;

  function show(state) {
    if (status) { status.textContent = state; status.setAttribute("data-state", state); }
    if (toggle) { toggle.textContent = live ? "Stop updating" : "Update live"; toggle.setAttribute("aria-pressed", String(live)); }
  }

  function apply(data) {
    Object.keys(data.values || {}).forEach(function (key) {
      document.querySelectorAll('[data-live="' + key + '"]').forEach(function (el) {
        if (el.textContent !== data.values[key]) { el.textContent = data.values[key]; }
      });
    });
    Object.keys(data.charts || {}).forEach(function (queue) {
      var chart = data.charts[queue];
      document.querySelectorAll('[data-chart="' + queue + '"]').forEach(function (svg) {
        var done = svg.querySelector(".done"), failed = svg.querySelector(".failed");
        if (done) { done.setAttribute("points", chart.completed); }
        if (failed) { failed.setAttribute("points", chart.failed); }
        svg.setAttribute("data-peak", String(chart.peak));
      });
    });
  }

  function tick() {
    if (!live) { return; }
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
      .then(function (data) { apply(data); show("live"); })
      .catch(function () { show("offline"); })
      .finally(function () { if (live) { timer = setTimeout(tick, 2000); } });
  }

  if (toggle) {
    toggle.addEventListener("click", function () {
      live = !live;
      if (timer) { clearTimeout(timer); timer = null; }
      show(live ? "live" : "paused");
      if (live) { tick(); }
    });
  }
  show("live");
  timer = setTimeout(tick, 2000);
})();
