// The batch form shows only the fields that apply to the chosen policy
// (fields marked data-policies="openai" and the like); without script, all show.
(function () {
  "use strict";
  const form = document.querySelector("[data-batch-form]");
  if (!form) return;
  const policy = form.querySelector("select[name=policy]");
  function update() {
    form.querySelectorAll(".field[data-policies]").forEach(function (field) {
      const applies = field.dataset.policies.split(" ").indexOf(policy.value) !== -1;
      field.hidden = !applies;
      field.querySelectorAll("input, select, textarea").forEach(function (input) {
        input.disabled = !applies;
      });
    });
  }
  policy.addEventListener("change", update);
  update();
})();
