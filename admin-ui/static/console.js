// usher console: confirmations, live refresh of [data-poll] regions, copy buttons. No
// dependencies; every action is a plain form POST that works without this script.
(function () {
  "use strict";

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var msg = form.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) {
      ev.preventDefault();
    }
  }, true);

  function poll(el) {
    var url = el.getAttribute("data-poll");
    var every = parseInt(el.getAttribute("data-interval"), 10) || 2000;
    function tick() {
      if (document.hidden) {
        return;
      }
      fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (resp) {
          if (resp.status === 401) {
            window.location.assign("/admin/signin");
            return null;
          }
          return resp.ok ? resp.text() : null;
        })
        .then(function (html) {
          if (html !== null && html !== undefined && !el.contains(document.activeElement)) {
            el.innerHTML = html;
          }
        })
        .catch(function () {});
    }
    window.setInterval(tick, every);
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-copy]");
    if (!btn) {
      return;
    }
    var text = document.getElementById(btn.getAttribute("data-copy")).textContent;
    var done = function () { btn.textContent = "Copied"; };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () {});
      return;
    }
    var area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    document.execCommand("copy");
    document.body.removeChild(area);
    done();
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll]").forEach(poll);
  });
})();
