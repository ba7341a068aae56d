// Several episodes of one seed, one step slider for all of them. Data comes from the page
// (json_script); achievement names and ids are set as text or attributes, never as HTML.
(function () {
  "use strict";
  const node = document.getElementById("seed-config");
  if (!node) return;
  const config = JSON.parse(node.textContent);
  const slider = document.getElementById("step");
  const output = document.getElementById("step-value");
  const sections = document.querySelectorAll(".seed-column");
  const max = Number(slider.max);

  function frameUrl(sha) {
    return config.frameUrl.replace("0".repeat(64), sha);
  }

  function turnAt(steps, step) {
    // The last turn whose request showed a frame at or before this step.
    let turn = 0;
    for (let i = 0; i < steps.length; i++) if (steps[i] <= step) turn = i;
    return turn;
  }

  function show(step) {
    step = Math.max(0, Math.min(max, step));
    slider.value = step;
    output.textContent = step;
    sections.forEach(function (section) {
      const column = config.columns[Number(section.dataset.column)];
      if (!column || !column.episode) return;
      const img = section.querySelector(".seed-frame");
      const note = section.querySelector(".frame-note");
      const last = column.frames.length - 1;
      const shown = Math.min(step, last);
      if (shown >= 0) img.src = frameUrl(column.frames[shown]);
      note.textContent = step > last ? "Episode over at step " + last + " (last frame shown)." : "";
      const unlocked = Object.entries(column.unlocked)
        .filter(function (kv) { return kv[1] <= step; })
        .map(function (kv) { return kv[0]; });
      section.querySelector(".unlocked").textContent =
        unlocked.length ? "Unlocked: " + unlocked.join(", ") : "Nothing unlocked yet.";
      const link = section.querySelector(".viewer-link");
      const base = config.viewerUrl.replace(/0\/$/, column.episode + "/");
      link.href = base + "?turn=" + turnAt(column.turnSteps, step);
    });
    const url = new URL(window.location.href);
    url.searchParams.set("step", step);
    window.history.replaceState(null, "", url);
  }

  slider.addEventListener("input", function () { show(Number(slider.value)); });
  document.querySelectorAll("#seed-scrub button[data-step]").forEach(function (button) {
    button.addEventListener("click", function () {
      show(Number(slider.value) + Number(button.dataset.step));
    });
  });
  document.addEventListener("keydown", function (event) {
    if (event.target.closest("input:not([type=range]), textarea")) return;
    const jump = event.shiftKey ? 10 : 1;
    if (event.key === "ArrowRight") show(Number(slider.value) + jump);
    else if (event.key === "ArrowLeft") show(Number(slider.value) - jump);
    else if (event.key === "Home") show(0);
    else if (event.key === "End") show(max);
    else return;
    event.preventDefault();
  });
  show(config.step);
})();
