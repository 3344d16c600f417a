// Live updates: every element with data-live="<fragment URL>" (the overview's rows, a channel's
// queue counts and workers, a job's status timeline, a channel's scheduled jobs) is replaced
// from its URL every data-refresh seconds, without reloading the page; the nearest ".live-stamp"
// (or #updated) says when, or that an update failed. A part whose content did not change is
// left alone (the first update too: the page rendered the same part), and a box the operator
// ticked in one that did stays ticked while the new part still has it (same name and value), so
// a form around a live list keeps its selection. Times are shown in UTC; hovering one shows the
// local time.
// The "select all" box ticks every letter's box. Actions need no script: each is a form and a
// confirmation page rendered by the server.
(function () {
  "use strict";

  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (node) {
      var when = new Date(node.getAttribute("datetime"));
      if (!isNaN(when.getTime())) { node.title = "local time: " + when.toLocaleString(); }
    });
  }

  // A copy of the part without the blank text at its ends (the page's template puts a line
  // break around the part it includes), for comparing two versions of it.
  function trimmed(part) {
    var copy = part.cloneNode(true);
    [copy.firstChild, copy.lastChild].forEach(function (node) {
      if (node && node.nodeType === Node.TEXT_NODE && !node.data.trim()) {
        copy.removeChild(node);
      }
    });
    return copy;
  }

  function ticked(element) {
    var boxes = {};
    element.querySelectorAll("input[type=checkbox]").forEach(function (box) {
      if (box.checked) { boxes[box.name + "\n" + box.value] = true; }
    });
    return boxes;
  }

  function live(element) {
    var url = element.dataset.live;
    var every = Math.max(1, Number(element.dataset.refresh) || 5) * 1000;
    var stamp = document.getElementById("updated") || document.querySelector(".live-stamp");
    var tick = function () {
      fetch(url, { credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.text();
        })
        .then(function (html) {
          var fresh = element.cloneNode(false);
          fresh.innerHTML = html;
          localTimes(fresh);
          if (!trimmed(fresh).isEqualNode(trimmed(element))) {
            var kept = ticked(element);
            fresh.querySelectorAll("input[type=checkbox]").forEach(function (box) {
              if (kept[box.name + "\n" + box.value]) { box.checked = true; }
            });
            element.replaceChildren.apply(element, Array.from(fresh.childNodes));
          }
          if (stamp) {
            stamp.textContent = "updated " + new Date().toLocaleTimeString();
            stamp.className = stamp.className.replace(" stale", "");
          }
        })
        .catch(function (error) {
          if (stamp) {
            stamp.textContent = "update failed (" + error.message + "), retrying";
            if (stamp.className.indexOf("stale") < 0) { stamp.className += " stale"; }
          }
        })
        .finally(function () { setTimeout(tick, every); });
    };
    setTimeout(tick, every);
  }

  function start() {
    var rows = document.getElementById("channel-rows");
    if (rows && !rows.dataset.live) { rows.dataset.live = "/fragment/channels"; }
    document.querySelectorAll("[data-live]").forEach(live);
    localTimes(document);
    var all = document.getElementById("select-all");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll("input[name=ids]").forEach(function (box) {
          box.checked = all.checked;
        });
      });
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
