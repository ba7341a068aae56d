// The batch form shows only the fields that apply to the chosen policy
// (fields marked data-policies="openai" and the like); without script, all show.
// It also shows, as its values change, which field is wrong: the estimate the form asks
// for as it changes (htmx) carries the form's errors by field (#batch-field-errors).
(function () {
  "use strict";
  const form = document.querySelector("[data-batch-form]");
  if (!form) return;
  const policy = form.querySelector("select[name=policy]");
  const estimate = document.getElementById("batch-estimate");
  const summary = document.querySelector("[data-form-errors]");
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

  // A field says it is wrong once its user has been at it (or the form was sent): a field
  // not yet reached (the model, on choosing the openai policy) is not yet a mistake. The
  // estimate box names every field still wrong meanwhile.
  const touched = new Set();
  form.querySelectorAll(".field.has-error").forEach(function (field) {
    touched.add(field.dataset.field);
  });
  function touch(event) {
    if (event.target.name) touched.add(event.target.name);
  }
  form.addEventListener("input", touch);
  form.addEventListener("change", touch);

  function showErrors(errors) {
    let wrong = 0;
    form.querySelectorAll(".field[data-field]").forEach(function (field) {
      const name = field.dataset.field;
      const messages = (!field.hidden && touched.has(name) && errors[name]) || [];
      field.querySelectorAll("small.error").forEach(function (old) {
        old.remove();
      });
      field.classList.toggle("has-error", messages.length > 0);
      field.querySelectorAll("[name]").forEach(function (input) {
        if (messages.length) input.setAttribute("aria-invalid", "true");
        else input.removeAttribute("aria-invalid");
      });
      messages.forEach(function (message) {
        const line = document.createElement("small");
        line.className = "error";
        line.setAttribute("role", "alert");
        line.textContent = message;
        field.appendChild(line);
      });
      if (messages.length) wrong += 1;
    });
    if (summary) {
      summary.hidden = wrong === 0;
      summary.textContent = wrong + " field" + (wrong === 1 ? "" : "s") + " to correct below.";
    }
  }

  document.body.addEventListener("htmx:afterSwap", function (event) {
    if (event.detail.target !== estimate) return;
    const data = estimate.querySelector("#batch-field-errors");
    showErrors(data ? JSON.parse(data.textContent) : {});
  });
})();
