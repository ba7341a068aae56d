// Searchable checkbox lists: typing narrows the visible choices, ticked ones stay counted.
(function () {
  "use strict";
  function setUp(list) {
    const search = list.querySelector("[data-checklist-search]");
    const count = list.querySelector("[data-checklist-count]");
    const options = Array.from(list.querySelectorAll(".checklist-option"));
    function refresh() {
      const query = search.value.trim().toLowerCase();
      let ticked = 0;
      options.forEach(function (option) {
        const box = option.querySelector("input");
        if (box.checked) ticked += 1;
        option.hidden = query !== "" && option.textContent.toLowerCase().indexOf(query) === -1;
      });
      count.textContent = ticked ? ticked + " selected" : "";
    }
    // Typing in the search box must not trigger the live counts (the form listens to keyup).
    search.addEventListener("input", refresh);
    search.addEventListener("keyup", function (event) { event.stopPropagation(); });
    search.addEventListener("change", function (event) { event.stopPropagation(); });
    search.addEventListener("keydown", function (event) {
      if (event.key === "Enter") event.preventDefault();
    });
    list.addEventListener("change", refresh);
    refresh();
  }
  document.querySelectorAll("[data-checklist]").forEach(setUp);
})();
