// Play page: one key press is one step, sent to the server, which records it as a turn.
// Presses queue while a step is in flight; each names the turn it is for, so a press that
// reaches the server twice is recorded once.
(function () {
  "use strict";

  const configNode = document.getElementById("play-config");
  if (!configNode) return;
  const config = JSON.parse(configNode.textContent);
  const keys = new Map(config.keys.map(([key, action]) => [key, action]));
  const SHA = /^[0-9a-f]{64}$/;
  const MAX_QUEUE = 4;
  const frame = document.getElementById("play-frame");
  const message = document.getElementById("play-message");
  let state = config.state;
  const queue = [];
  let busy = false;

  function frameUrl(sha) {
    return SHA.test(sha) ? config.frameUrl.replace("0".repeat(64), sha) : "";
  }

  function say(text, isError) {
    message.textContent = text;
    message.classList.toggle("error", Boolean(isError));
  }

  function chips(box, values, className) {
    box.replaceChildren();
    for (const value of values) {
      const chip = document.createElement("span");
      chip.className = "chip" + (className ? " " + className : "");
      chip.textContent = String(value);
      box.appendChild(chip);
    }
    if (!values.length) {
      const none = document.createElement("span");
      none.className = "muted small";
      none.textContent = "none";
      box.appendChild(none);
    }
  }

  function renderVitals(vitals) {
    const box = document.getElementById("play-vitals");
    box.replaceChildren();
    for (const name of ["health", "food", "drink", "energy"]) {
      const value = Number(vitals[name] || 0);
      const label = document.createElement("span");
      label.textContent = name;
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.className = "bar-fill " + name;
      fill.style.width = Math.max(0, Math.min(9, value)) * (100 / 9) + "%";
      bar.appendChild(fill);
      const number = document.createElement("span");
      number.className = "num";
      number.dataset.vital = name;
      number.textContent = String(value);
      box.append(label, bar, number);
    }
  }

  function render() {
    const s = state.state || {};
    const url = frameUrl(state.frame);
    if (url && frame.getAttribute("src") !== url) frame.src = url;
    document.getElementById("play-step").textContent = String(state.step);
    document.getElementById("play-turns").textContent = String(state.turns);
    document.getElementById("play-reward").textContent = Number(state.total_reward).toFixed(1);
    const badge = document.getElementById("play-status");
    badge.textContent = state.status;
    badge.className = "badge status-" + state.status;
    renderVitals(s.vitals || {});
    chips(
      document.getElementById("play-inventory"),
      Object.entries(s.inventory || {}).map(([k, v]) => k + " ×" + v)
    );
    chips(document.getElementById("play-achievements"), state.achievements || [], "ok");
    document.body.dataset.turns = String(state.turns);
  }

  async function send(action) {
    const body = new URLSearchParams({ action: action, turn: String(state.turns) });
    const response = await fetch(config.stepUrl, {
      method: "POST",
      headers: { "X-CSRFToken": config.csrf, "Content-Type": "application/x-www-form-urlencoded" },
      body: body,
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => ({ error: "the server answered " + response.status }));
    if (!response.ok) throw new Error(data.error || "the server answered " + response.status);
    return data;
  }

  async function drain() {
    if (busy) return;
    busy = true;
    try {
      while (queue.length && state.status === "running") {
        const action = queue.shift();
        try {
          const data = await send(action);
          state = data;
          render();
          if (data.unlocked && data.unlocked.length) say("unlocked: " + data.unlocked.join(", "));
          else if (data.status !== "running") say("The game has ended. Open it in the viewer to review it.");
          else say(action);
        } catch (error) {
          queue.length = 0;
          say("not played: " + error.message, true);
        }
      }
    } finally {
      busy = false;
      document.body.dataset.idle = queue.length ? "false" : "true";
    }
  }

  function play(action) {
    if (queue.length >= MAX_QUEUE) {
      say("slow down: " + MAX_QUEUE + " keys are waiting", true);
      return;
    }
    queue.push(action);
    document.body.dataset.idle = "false";
    drain();
  }

  // Touch screens have no keys: each action of the key map is a button too.
  document.querySelectorAll("[data-play]").forEach((button) =>
    button.addEventListener("click", () => {
      if (config.canPlay && state.status === "running") play(button.dataset.play);
    })
  );

  document.addEventListener("keydown", (event) => {
    if (!config.canPlay || state.status !== "running") return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target.closest && event.target.closest("input, textarea, select")) return;
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    const action = keys.get(key);
    if (!action) return;
    event.preventDefault();
    if (event.repeat) return; // one press, one step
    play(action);
  });

  document.body.dataset.idle = "true";
  render();
})();
