// Training pages: line numbers beside the TOML editor (errors marked on their lines),
// jumping to a line from an error, the endpoint list following the provider, and the copy
// button of the fine-tuned model id.
(function () {
  "use strict";
  function errorLines() {
    var check = document.getElementById("config-check");
    var text = check ? check.getAttribute("data-error-lines") || "" : "";
    return text.split(",").filter(Boolean).map(Number);
  }
  function renderGutter() {
    var area = document.getElementById("id_config");
    var gutter = document.getElementById("toml-gutter");
    if (!area || !gutter) return;
    var count = area.value.split("\n").length;
    var bad = new Set(errorLines());
    var parts = [];
    for (var i = 1; i <= count; i++) {
      parts.push(bad.has(i) ? '<span class="bad" title="see the problem list">' + i + "</span>" : String(i));
    }
    gutter.innerHTML = parts.join("\n");
    gutter.scrollTop = area.scrollTop;
  }
  function gotoLine(line) {
    var area = document.getElementById("id_config");
    if (!area) return;
    var lines = area.value.split("\n");
    var start = 0;
    for (var i = 0; i < line - 1 && i < lines.length; i++) start += lines[i].length + 1;
    area.focus();
    area.setSelectionRange(start, start + (lines[line - 1] || "").length);
    var lineHeight = parseFloat(getComputedStyle(area).lineHeight) || 18;
    area.scrollTop = Math.max(0, (line - 4) * lineHeight);
  }
  // Only the endpoints of the chosen provider are listed (each option's data-kind); one of
  // another provider that was selected gives way to the provider's first.
  function followProvider() {
    var provider = document.getElementById("id_provider");
    var endpoint = document.getElementById("id_endpoint");
    if (!provider || !endpoint) return;
    var first = null;
    Array.prototype.forEach.call(endpoint.options, function (option) {
      var kind = option.getAttribute("data-kind");
      var fits = !kind || kind === provider.value;
      option.hidden = !fits;
      option.disabled = !fits;
      if (fits && kind && first === null) first = option;
    });
    var current = endpoint.options[endpoint.selectedIndex];
    if (!current || current.disabled) {
      if (first) endpoint.value = first.value;
      else endpoint.selectedIndex = -1;
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    var provider = document.getElementById("id_provider");
    if (provider) {
      // On the select itself: it runs before the form's live check reads the fields.
      provider.addEventListener("change", followProvider);
      followProvider();
    }
    var area = document.getElementById("id_config");
    if (area) {
      area.addEventListener("input", renderGutter);
      area.addEventListener("scroll", function () {
        document.getElementById("toml-gutter").scrollTop = area.scrollTop;
      });
      // Tab inserts two spaces instead of leaving the editor.
      area.addEventListener("keydown", function (event) {
        if (event.key === "Tab" && !event.shiftKey) {
          event.preventDefault();
          var s = area.selectionStart;
          area.setRangeText("  ", s, area.selectionEnd, "end");
        }
      });
      renderGutter();
    }
  });
  document.addEventListener("htmx:afterSwap", renderGutter);
  document.addEventListener("click", function (event) {
    var link = event.target.closest(".goto-line");
    if (link) {
      event.preventDefault();
      gotoLine(Number(link.getAttribute("data-line")));
      return;
    }
    var button = event.target.closest("[data-copy]");
    if (button) {
      var target = document.querySelector(button.getAttribute("data-copy"));
      var text = target ? target.textContent.trim() : "";
      var done = function () { button.textContent = "Copied"; setTimeout(function () { button.textContent = "Copy"; }, 1500); };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done, function () { fallback(text); done(); });
      } else { fallback(text); done(); }
    }
  });
  function fallback(text) {
    var tmp = document.createElement("textarea");
    tmp.value = text; document.body.appendChild(tmp); tmp.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing else to try */ }
    document.body.removeChild(tmp);
  }
})();
