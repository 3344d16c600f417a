// The overview updates its rows from /fragment/channels every few seconds (no full reload);
// the channel page's "select all" box. Actions need no script: each is a form and a
// confirmation page rendered by the server.
(function () {
  "use strict";
  function start() {
    var rows = document.getElementById("channel-rows");
    var stamp = document.getElementById("updated");
    if (rows) {
      var every = Math.max(1, Number(rows.dataset.refresh) || 5) * 1000;
      var tick = function () {
        fetch("/fragment/channels", { credentials: "same-origin" })
          .then(function (response) {
            if (!response.ok) { throw new Error("HTTP " + response.status); }
            return response.text();
          })
          .then(function (html) {
            rows.innerHTML = html;
            stamp.textContent = "updated " + new Date().toLocaleTimeString();
            stamp.className = "";
          })
          .catch(function (error) {
            stamp.textContent = "update failed (" + error.message + "), retrying";
            stamp.className = "stale";
          })
          .finally(function () { setTimeout(tick, every); });
      };
      setTimeout(tick, every);
    }
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
