// The turn list's ticked rows: a checkbox per row, shift-click (or shift+space) ticks a range,
// the header's box ticks the page, "Select all N matching" turns the bar's actions onto every
// turn the filters match. The bar is a plain GET form (the server asks to confirm, naming
// the count); this only keeps its count and its scope.
(function () {
  "use strict";
  const bar = document.getElementById("turn-bulk");
  if (!bar) return;
  const boxes = Array.from(document.querySelectorAll('input[type=checkbox][name=turn][form="turn-bulk"]'));
  const pageBox = document.querySelector("[data-select-page]");
  const scope = bar.querySelector("[data-scope]");
  const status = bar.querySelector("[data-selected-count]");
  const selectAll = bar.querySelector("[data-select-all]");
  const clear = bar.querySelector("[data-clear]");
  const actions = Array.from(bar.querySelectorAll("button[name=action]"));
  const matching = Number(bar.dataset.matching || 0);
  const about = bar.dataset.estimated === "true" ? "about " : "";
  let anchor = -1; // the last box ticked or unticked by hand: one end of a shift range
  let shiftHeld = false; // keyboard: shift+space toggles a box with a click that may not say so

  document.addEventListener("keydown", function (event) { if (event.key === "Shift") shiftHeld = true; });
  document.addEventListener("keyup", function (event) { if (event.key === "Shift") shiftHeld = false; });
  window.addEventListener("blur", function () { shiftHeld = false; });

  function plural(n, word) { return n.toLocaleString("en") + " " + word + (n === 1 ? "" : "s"); }

  function refresh() {
    const ticked = boxes.filter(function (box) { return box.checked; }).length;
    const everyMatch = scope.value === "filter";
    if (pageBox) {
      pageBox.checked = ticked > 0 && ticked === boxes.length;
      pageBox.indeterminate = ticked > 0 && ticked < boxes.length;
    }
    if (everyMatch) {
      status.textContent = "All " + about + plural(matching, "matching turn") + " selected";
    } else {
      status.textContent = ticked ? plural(ticked, "turn") + " ticked" : "No turn ticked";
    }
    // Offered once the whole page is ticked and more turns match than the page shows.
    selectAll.hidden = everyMatch || ticked < boxes.length || matching <= boxes.length;
    clear.hidden = !everyMatch && ticked === 0;
    actions.forEach(function (button) { button.disabled = !everyMatch && ticked === 0; });
    bar.classList.toggle("has-selection", everyMatch || ticked > 0);
  }

  boxes.forEach(function (box, i) {
    box.addEventListener("click", function (event) {
      if ((event.shiftKey || shiftHeld) && anchor >= 0 && anchor !== i) {
        const from = Math.min(anchor, i), to = Math.max(anchor, i);
        for (let j = from; j <= to; j++) boxes[j].checked = box.checked;
      }
      anchor = i;
      scope.value = "selection"; // a row changed by hand: the ticked turns again
      refresh();
    });
  });
  if (pageBox) {
    pageBox.addEventListener("change", function () {
      boxes.forEach(function (box) { box.checked = pageBox.checked; });
      anchor = -1;
      scope.value = "selection";
      refresh();
    });
  }
  selectAll.addEventListener("click", function () {
    boxes.forEach(function (box) { box.checked = true; });
    scope.value = "filter";
    refresh();
    clear.focus();
  });
  clear.addEventListener("click", function () {
    boxes.forEach(function (box) { box.checked = false; });
    anchor = -1;
    scope.value = "selection";
    refresh();
    if (pageBox) pageBox.focus();
  });
  // Back from the confirmation, the browser may restore ticked boxes: count them again.
  window.addEventListener("pageshow", function () { scope.value = "selection"; refresh(); });
  refresh();
})();
