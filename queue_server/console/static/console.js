// The console's one script (the pages' Content-Security-Policy runs no other, and
// nothing inline). Without it every page is as the server drew it.
(function () {
  "use strict";

  // An id's copy button (shown only where this script runs) copies the whole id.
  function wireCopy(scope) {
    scope.querySelectorAll("button.copy[data-copy]").forEach(function (button) {
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
  }
  wireCopy(document);

  // "Select all on this page" (shown only where this script runs) checks or clears the
  // box of every row of its form; a row's own box changed by hand updates it.
  document.querySelectorAll("input[data-select-all]").forEach(function (all) {
    var form = all.form;
    var label = all.closest("label");
    if (label) { label.hidden = false; }
    var rows = function () { return form.querySelectorAll('input[type=checkbox][name="item_id"]'); };
    all.addEventListener("change", function () {
      rows().forEach(function (box) { box.checked = all.checked; });
    });
    form.addEventListener("change", function (event) {
      if (event.target === all || event.target.name !== "item_id") { return; }
      var boxes = Array.prototype.slice.call(rows());
      all.checked = boxes.length > 0 && boxes.every(function (box) { return box.checked; });
    });
  });

  // Live pages. Every two seconds, while live:
  // - numbers: the JSON at data-live-url gives each number by its element's data-live
  //   key, each chart's lines (data-chart="queue"): the queues page; and each figure
  //   (data-figure="key"), drawn whole by the server: a queue's charts, the queues
  //   page's warning of a held snapshot;
  // - regions: the page itself is fetched again and each [data-live-region] whose HTML
  //   changed is put in place, unless the reader is working in it (a box checked, a
  //   field focused): an item's facts and ledger, the lists of items and dead letters.
  // No page reload; "Stop updating" stops asking.
  var numbers = document.querySelector("[data-live-url]");
  var regions = document.querySelectorAll("[data-live-region]");
  if (!numbers && !regions.length) { return; }
  var toggle = document.querySelector("[data-live-toggle]");
  var status = document.querySelector("[data-live-status]");
  var bar = document.querySelector(".live-bar");
  if (bar) { bar.hidden = false; }
  var live = true;
  var timer = null;

  function show(state) {
    if (status) { status.textContent = state; status.setAttribute("data-state", state); }
    if (toggle) {
      toggle.textContent = live ? "Stop updating" : "Update live";
      toggle.setAttribute("aria-pressed", String(live));
    }
  }

  function fetched(url, accept) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": accept } })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r; });
  }

  function putNumbers(data) {
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
    // A queue's figures (data-figure="key"): the server's SVG, put in place whole.
    Object.keys(data.figures || {}).forEach(function (key) {
      var old = document.querySelector('[data-figure="' + key + '"]');
      if (!old) { return; }
      var made = document.createElement("template");
      made.innerHTML = data.figures[key];
      var fresh = made.content.firstElementChild;
      if (fresh) { old.replaceWith(fresh); }
    });
  }

  function busy(region) {
    var focused = document.activeElement;
    return Boolean(region.querySelector("input:checked")) ||
      (region.contains(focused) &&
        focused.matches("input:not([type=checkbox]):not([type=radio]), textarea, select"));
  }

  function putRegions(html) {
    var page = new DOMParser().parseFromString(html, "text/html");
    regions.forEach(function (region) {
      var name = region.getAttribute("data-live-region");
      var fresh = page.querySelector('[data-live-region="' + name + '"]');
      if (!fresh || fresh.innerHTML === region.innerHTML || busy(region)) { return; }
      region.innerHTML = fresh.innerHTML;
      wireCopy(region);
    });
  }

  function tick() {
    if (!live) { return; }
    var asks = [];
    if (numbers) {
      asks.push(fetched(numbers.getAttribute("data-live-url"), "application/json")
        .then(function (r) { return r.json(); }).then(putNumbers));
    }
    if (regions.length) {
      asks.push(fetched(location.href, "text/html")
        .then(function (r) { return r.text(); }).then(putRegions));
    }
    Promise.all(asks)
      .then(function () { show("live"); })
      .catch(function () { show("offline"); })
      .finally(function () { if (live) { timer = setTimeout(tick, 2000); } });
  }

  // A span switch (the hour or the day of a queue's figures): its links work as links
  // without this script; with it the figures switch in place and the address follows.
  document.querySelectorAll("[data-span-switch] a[data-span-url]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      if (!numbers || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
      event.preventDefault();
      numbers.setAttribute("data-live-url", link.getAttribute("data-span-url"));
      document.querySelectorAll("[data-span-switch] a").forEach(function (other) {
        if (other === link) { other.setAttribute("aria-current", "page"); }
        else { other.removeAttribute("aria-current"); }
      });
      history.replaceState(null, "", link.getAttribute("href"));
      if (timer) { clearTimeout(timer); timer = null; }
      live = true;
      tick();
    });
  });

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
