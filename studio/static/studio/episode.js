// Episode viewer: renders the turn at the cursor from the page's JSON, so moving between
// turns costs no request. Every string from a turn is model output: it is only ever set
// with textContent, never parsed as HTML.
(function () {
  "use strict";

  const turnsNode = document.getElementById("turns-data");
  const configNode = document.getElementById("viewer-config");
  if (!turnsNode || !configNode) return;
  const turns = JSON.parse(turnsNode.textContent);
  const config = JSON.parse(configNode.textContent);
  if (!turns.length) return;

  const SHA = /^[0-9a-f]{64}$/;
  const byId = new Map(turns.map((t) => [t.id, t]));
  const panel = document.getElementById("turn-panel");
  const mainImage = document.getElementById("frame-main");
  const scrubber = document.getElementById("scrubber");
  const position = document.getElementById("turn-pos");
  const strip = document.getElementById("filmstrip");
  const thumbs = buildFilmstrip();
  const help = document.getElementById("help");
  const flagButton = document.getElementById("flag-button");
  const flagState = document.getElementById("flag-state");
  const noteForm = document.getElementById("note-form");
  const noteInput = document.getElementById("note");
  const noteReadonly = document.getElementById("note-readonly");
  const status = document.getElementById("review-status");
  // Notes sent and not yet confirmed, by turn id: applied when the server says it stored them.
  const pendingNotes = new Map();
  const chart = document.getElementById("chart");
  const zoom = document.getElementById("zoom");
  const zoomImage = document.getElementById("zoom-image");
  const editor = document.getElementById("relabel-editor");
  const picked = document.getElementById("relabel-picked");
  const reasonInput = document.getElementById("relabel-reason");
  const forkForm = document.getElementById("fork-form");
  const forkTurn = document.getElementById("fork-turn");
  const forkCorrection = document.getElementById("fork-correction");
  const keyActions = new Map((config.keys || []).map(([key, action]) => [key, action]));
  const MAX_RELABEL = 8;
  let picks = [];
  let cursor = 0;

  function frameUrl(sha) {
    return SHA.test(sha) ? config.frameUrl.replace("0".repeat(64), sha) : "";
  }

  function idUrl(template, id) {
    // Templates are reversed with id 0: /turns/0/flag/ -> /turns/<id>/flag/
    return template.replace("/0/", "/" + Number(id) + "/");
  }

  function buildFilmstrip() {
    const fragment = document.createDocumentFragment();
    const built = turns.map((turn, i) => {
      const thumb = document.createElement("button");
      thumb.type = "button";
      thumb.className = "thumb";
      thumb.classList.toggle("flagged", turn.flagged);
      thumb.classList.toggle("has-error", Boolean(turn.error));
      thumb.classList.toggle("has-unlock", turn.unlocked.length > 0);
      thumb.dataset.i = String(i);
      thumb.title = "Turn " + turn.index + " · step " + turn.step;
      const img = document.createElement("img");
      img.className = "pixel";
      img.loading = "lazy";
      img.width = 48;
      img.height = 48;
      img.alt = "";
      img.src = frameUrl(turn.frame);
      const label = document.createElement("span");
      label.textContent = String(turn.index);
      thumb.append(img, label);
      fragment.appendChild(thumb);
      return thumb;
    });
    strip.appendChild(fragment);
    return built;
  }

  function field(name) {
    return panel.querySelector('[data-field="' + name + '"]');
  }

  function section(name, visible) {
    const node = panel.querySelector('[data-section="' + name + '"]');
    if (node) node.hidden = !visible;
  }

  function setText(name, value) {
    field(name).textContent = value == null ? "" : String(value);
  }

  function chips(name, values, className) {
    const box = field(name);
    box.replaceChildren();
    for (const value of values) {
      const chip = document.createElement("span");
      chip.className = "chip" + (className ? " " + className : "");
      chip.textContent = String(value);
      box.appendChild(chip);
    }
  }

  function renderReview(turn) {
    if (flagButton) {
      flagButton.setAttribute("aria-pressed", turn.flagged ? "true" : "false");
      flagButton.classList.toggle("on", turn.flagged);
      flagButton.textContent = turn.flagged ? "⚑ Flagged" : "⚐ Flag";
    }
    if (flagState) {
      flagState.textContent = turn.flagged ? "⚑ flagged" : "not flagged";
      flagState.classList.toggle("warn", turn.flagged);
    }
    if (noteInput && document.activeElement !== noteInput) noteInput.value = turn.note || "";
    if (noteReadonly) noteReadonly.textContent = turn.note || "";
    thumbs[turns.indexOf(turn)].classList.toggle("flagged", turn.flagged);
  }

  function render() {
    const turn = turns[cursor];
    mainImage.src = frameUrl(turn.frame);
    scrubber.value = String(cursor);
    position.textContent = cursor + 1 + " / " + turns.length;
    setText("index", turn.index);
    setText("step", turn.step);
    setText("reward", "reward " + Number(turn.reward).toFixed(2));
    chips("actions", turn.actions.length ? turn.actions : ["(none)"], "action");
    chips("unlocked", turn.unlocked, "ok");
    section("unlocked", turn.unlocked.length > 0);
    setText("error", turn.error);
    setText("error_kind", turn.error_kind);
    section("error", Boolean(turn.error));
    if (turn.model_text == null) {
      setText("model_text", "(no text)");
      field("model_text").classList.add("muted");
    } else {
      setText("model_text", turn.model_text);
      field("model_text").classList.remove("muted");
    }
    setText("tool_calls", turn.tool_calls.length ? JSON.stringify(turn.tool_calls, null, 2) : "");
    section("tool_calls", turn.tool_calls.length > 0);
    setText("reasoning", turn.reasoning);
    section("reasoning", Boolean(turn.reasoning));
    setText("observation", turn.observation);
    renderClipped(turn);
    renderSeen(turn);
    const vitals = Object.entries(turn.vitals || {}).map(([k, v]) => k + " " + v);
    const inventory = Object.entries(turn.inventory || {}).map(([k, v]) => k + " ×" + v);
    chips("vitals", vitals.concat(inventory));
    const meta = [];
    if (turn.prompt_tokens || turn.completion_tokens)
      meta.push(turn.prompt_tokens + " + " + turn.completion_tokens + " tokens");
    if (turn.latency_ms) meta.push(turn.latency_ms + " ms");
    if (turn.retries) meta.push(turn.retries + " retries");
    if (turn.finish_reason) meta.push("finish: " + turn.finish_reason);
    if (turn.text_fallback) meta.push("actions parsed from text");
    setText("meta", meta.join(" · "));
    renderRelabel(turn);
    renderReview(turn);
    moveChartCursor();
    if (!zoom.hidden) zoomImage.src = mainImage.src;
    thumbs.forEach((thumb, i) => thumb.classList.toggle("current", i === cursor));
    thumbs[cursor].scrollIntoView({ block: "nearest", inline: "center" });
    history.replaceState(null, "", "?turn=" + cursor);
    // Warm the neighbours so that the next key press shows its frame at once.
    for (const j of [cursor - 1, cursor + 1]) {
      if (turns[j]) new Image().src = frameUrl(turns[j].frame);
    }
  }

  // Long texts arrive cut (selectors_review.clip_for_page); a button loads the rest as text.
  function renderClipped(turn) {
    panel.querySelectorAll(".load-rest").forEach((node) => node.remove());
    for (const [name, length] of Object.entries(turn.clipped || {})) {
      const target = field(name);
      const button = document.createElement("button");
      button.type = "button";
      button.className = "secondary load-rest";
      button.textContent = "Show all (" + Number(length) + " characters)";
      button.addEventListener("click", () => {
        button.disabled = true;
        const url = idUrl(config.textUrl, turn.id).replace("/model_text/", "/" + name + "/");
        fetch(url, { credentials: "same-origin" })
          .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
          .then((text) => {
            if (turns[cursor] === turn) target.textContent = text;
            button.remove();
          })
          .catch(() => {
            button.disabled = false;
            button.textContent = "Not loaded; try again";
          });
      });
      target.after(button);
    }
  }

  function renderRelabel(turn) {
    const relabel = turn.relabel;
    section("relabel", Boolean(relabel));
    chips("relabel", relabel ? relabel.actions : [], "action ok");
    setText("relabel_meta", relabel ? "by " + (relabel.by || "?") + ", " + relabel.at.slice(0, 16).replace("T", " ") + " UTC" : "");
    setText("relabel_reason", relabel ? relabel.reason : "");
    if (forkTurn) forkTurn.value = String(turn.index);
    if (forkCorrection) {
      forkCorrection.disabled = !relabel;
      if (!relabel) forkCorrection.checked = false;
    }
  }

  // --- relabel: pick the actions the turn should have taken, with the play page's keys ---

  function csrfToken() {
    const input = document.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function renderPicks() {
    picked.replaceChildren();
    for (const action of picks) {
      const chip = document.createElement("span");
      chip.className = "chip action";
      chip.textContent = action;
      picked.appendChild(chip);
    }
    if (!picks.length) {
      const hint = document.createElement("span");
      hint.className = "muted small";
      hint.textContent = "no action picked yet";
      picked.appendChild(hint);
    }
  }

  function openEditor() {
    if (!config.canReview || !editor) {
      say("You can look; relabeling needs the review permission.", true);
      return;
    }
    const turn = turns[cursor];
    picks = turn.relabel ? turn.relabel.actions.slice() : [];
    reasonInput.value = turn.relabel ? turn.relabel.reason : "";
    editor.hidden = false;
    renderPicks();
    editor.scrollIntoView({ block: "nearest" });
  }

  function closeEditor() {
    if (editor) editor.hidden = true;
    if (document.activeElement === reasonInput) reasonInput.blur();
  }

  function pick(action) {
    if (picks.length >= MAX_RELABEL) {
      say("at most " + MAX_RELABEL + " actions", true);
      return;
    }
    picks.push(action);
    renderPicks();
  }

  async function sendRelabel(values) {
    const turn = turns[cursor];
    say("saving correction…");
    const response = await fetch(idUrl(config.relabelUrl, turn.id), {
      method: "POST",
      headers: { "X-CSRFToken": csrfToken(), "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(values),
      credentials: "same-origin",
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      say("not saved (" + response.status + (data.error ? ": " + data.error : "") + ")", true);
      return;
    }
    const target = byId.get(data.id);
    if (target) target.relabel = data.relabel;
    closeEditor();
    if (target === turns[cursor]) renderRelabel(target);
    say(data.relabel ? "correction saved" : "correction removed");
  }

  function saveRelabel() {
    if (!picks.length) {
      say("pick at least one action", true);
      return;
    }
    sendRelabel({ actions: picks.join(" "), reason: reasonInput.value });
  }

  function editorKey(event) {
    if (event.target === reasonInput) {
      if (event.key === "Enter") {
        event.preventDefault();
        saveRelabel();
      } else if (event.key === "Escape") {
        reasonInput.blur();
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key.length === 1 ? event.key.toLowerCase() : event.key;
    if (keyActions.has(key)) {
      pick(keyActions.get(key));
    } else if (event.key === "Backspace") {
      picks.pop();
      renderPicks();
    } else if (event.key === "Enter") {
      saveRelabel();
    } else if (event.key === "Escape") {
      closeEditor();
    } else {
      return;
    }
    event.preventDefault();
  }

  // --- moving by kind of turn, the larger frame, the chart ---

  function seek(step, test) {
    for (let i = cursor + step; i >= 0 && i < turns.length; i += step) {
      if (test(turns[i])) {
        go(i);
        return;
      }
    }
    say("no " + (step > 0 ? "later" : "earlier") + " turn of that kind");
  }

  const isFlagged = (t) => t.flagged;
  const hasError = (t) => Boolean(t.error);
  const hasUnlock = (t) => t.unlocked.length > 0;

  function toggleZoom(show) {
    zoom.hidden = show === undefined ? !zoom.hidden : !show;
    if (!zoom.hidden) zoomImage.src = mainImage.src;
  }

  const SVG = "http://www.w3.org/2000/svg";
  const CHART = { w: 400, h: 130, left: 18, right: 30, top: 8, bottom: 16 };
  const SERIES = [
    ["health", "#c0392b"],
    ["food", "#d68910"],
    ["drink", "#2e86c1"],
    ["energy", "#7d3c98"],
  ];
  let chartCursor = null;

  function svg(name, attributes) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    return node;
  }

  function chartX(i) {
    const span = Math.max(turns.length - 1, 1);
    return CHART.left + (i / span) * (CHART.w - CHART.left - CHART.right);
  }

  function buildChart() {
    if (!chart) return;
    const bottom = CHART.h - CHART.bottom;
    const height = bottom - CHART.top;
    const vitalY = (v) => bottom - (Math.max(0, Math.min(9, Number(v) || 0)) / 9) * height;
    let total = 0;
    const cumulative = turns.map((t) => (total += Number(t.reward) || 0));
    const low = Math.min(0, ...cumulative);
    const high = Math.max(1, ...cumulative);
    const rewardY = (r) => bottom - ((r - low) / (high - low)) * height;
    chart.appendChild(svg("line", { x1: CHART.left, x2: CHART.w - CHART.right, y1: bottom, y2: bottom, stroke: "#ccc" }));
    for (const [label, y] of [["9", CHART.top + 3], ["0", bottom]]) {
      const text = svg("text", { x: 2, y: y });
      text.textContent = label;
      chart.appendChild(text);
    }
    for (const [label, y] of [[high.toFixed(0), CHART.top + 3], [low.toFixed(0), bottom]]) {
      const text = svg("text", { x: CHART.w - CHART.right + 4, y: y });
      text.textContent = label;
      chart.appendChild(text);
    }
    const caption = svg("text", { x: CHART.left, y: CHART.h - 3 });
    caption.textContent = "turn 0 … " + (turns.length - 1) + " · vitals 0–9 (left), cumulative reward (right)";
    chart.appendChild(caption);
    const line = (values, y, color, name) => {
      const points = values.map((v, i) => chartX(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      chart.appendChild(svg("polyline", { points: points, fill: "none", stroke: color, "stroke-width": 1.4, "data-series": name }));
    };
    for (const [name, color] of SERIES) line(turns.map((t) => (t.vitals || {})[name]), vitalY, color, name);
    line(cumulative, rewardY, "#2f6f3e", "reward");
    chartCursor = svg("line", { y1: CHART.top - 4, y2: bottom, stroke: "#1d1d1f", "stroke-width": 1.2, "stroke-dasharray": "3 2", id: "chart-cursor" });
    chart.appendChild(chartCursor);
    chart.addEventListener("click", (event) => {
      const box = chart.getBoundingClientRect();
      const x = ((event.clientX - box.left) / box.width) * CHART.w;
      const span = CHART.w - CHART.left - CHART.right;
      go(Math.round(((x - CHART.left) / span) * Math.max(turns.length - 1, 1)));
    });
  }

  function moveChartCursor() {
    if (!chartCursor) return;
    const x = chartX(cursor).toFixed(1);
    chartCursor.setAttribute("x1", x);
    chartCursor.setAttribute("x2", x);
  }

  function renderSeen(turn) {
    const box = field("seen");
    box.replaceChildren();
    for (const seen of turn.seen) {
      const figure = document.createElement("figure");
      const img = document.createElement("img");
      img.className = "pixel";
      img.width = 128;
      img.height = 128;
      img.alt = "frame at step " + seen.step;
      const url = frameUrl(seen.frame);
      if (url) img.src = url;
      const caption = document.createElement("figcaption");
      caption.textContent = "step " + seen.step + (url ? "" : " (missing)");
      figure.append(img, caption);
      box.appendChild(figure);
    }
  }

  function go(index) {
    const next = Math.min(Math.max(index, 0), turns.length - 1);
    if (next === cursor && mainImage.src) return;
    saveNoteIfChanged();
    cursor = next;
    status.textContent = "";
    render();
  }

  function say(text, isError) {
    status.textContent = text;
    status.classList.toggle("error", Boolean(isError));
  }

  function toggleFlag() {
    if (!config.canReview || !flagButton) {
      say("You can look; flagging needs the review permission.", true);
      return;
    }
    const turn = turns[cursor];
    const wanted = !turn.flagged;
    turn.flagged = wanted; // shown at once, confirmed or undone when the server answers
    renderReview(turn);
    say("saving…");
    htmx
      .ajax("POST", idUrl(config.flagUrl, turn.id), {
        source: flagButton,
        swap: "none",
        values: { flagged: wanted ? "1" : "0" },
      })
      .catch(() => {});
  }

  function saveNote() {
    if (!config.canReview || !noteInput) return;
    const turn = turns[cursor];
    const text = noteInput.value;
    if (pendingNotes.get(turn.id) === text.trim()) return; // blur and submit both ask
    pendingNotes.set(turn.id, text.trim());
    say("saving note…");
    htmx
      .ajax("POST", idUrl(config.noteUrl, turn.id), {
        source: noteForm,
        swap: "none",
        values: { note: text },
      })
      .catch(() => {});
  }

  function saveNoteIfChanged() {
    if (noteInput && noteInput.value.trim() !== (turns[cursor].note || "")) saveNote();
  }

  function toggleHelp(show) {
    help.hidden = show === undefined ? !help.hidden : !show;
  }

  document.body.addEventListener("studio:turn-reviewed", (event) => {
    const detail = event.detail || {};
    const turn = byId.get(detail.id);
    if (!turn) return;
    turn.flagged = Boolean(detail.flagged);
    if (pendingNotes.has(turn.id)) {
      turn.note = pendingNotes.get(turn.id);
      pendingNotes.delete(turn.id);
    }
    if (turn === turns[cursor]) {
      renderReview(turn);
      say(turn.flagged ? "saved · flagged" : "saved");
    } else {
      thumbs[turns.indexOf(turn)].classList.toggle("flagged", turn.flagged);
    }
  });

  document.body.addEventListener("htmx:responseError", (event) => {
    const xhr = event.detail.xhr;
    const path = event.detail.requestConfig ? event.detail.requestConfig.path : "";
    const match = /\/turns\/(\d+)\/(flag|note)\//.exec(path || "");
    if (match) {
      const turn = byId.get(Number(match[1]));
      if (turn && match[2] === "flag") {
        turn.flagged = !turn.flagged;
        if (turn === turns[cursor]) renderReview(turn);
      }
      if (turn) pendingNotes.delete(turn.id);
    }
    say("not saved (" + xhr.status + (xhr.status === 403 ? ": no permission" : "") + ")", true);
  });
  document.body.addEventListener("htmx:sendError", () => say("not saved: the server did not answer", true));

  document.addEventListener("keydown", (event) => {
    if (editor && !editor.hidden) {
      editorKey(event);
      return;
    }
    const typing = event.target.closest && event.target.closest("input, textarea, select");
    if (typing === noteInput && noteInput) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        saveNote();
      } else if (event.key === "Escape") {
        noteInput.blur();
      }
      return;
    }
    if (typing && typing !== scrubber) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    switch (event.key) {
      case "ArrowLeft":
        go(cursor - 1);
        break;
      case "ArrowRight":
        go(cursor + 1);
        break;
      case "Home":
        go(0);
        break;
      case "End":
        go(turns.length - 1);
        break;
      case "f":
        toggleFlag();
        break;
      case "]":
        seek(1, isFlagged);
        break;
      case "[":
        seek(-1, isFlagged);
        break;
      case "e":
        seek(1, hasError);
        break;
      case "E":
        seek(-1, hasError);
        break;
      case "a":
        seek(1, hasUnlock);
        break;
      case "A":
        seek(-1, hasUnlock);
        break;
      case "z":
        toggleZoom();
        break;
      case "r":
        openEditor();
        break;
      case "n":
        if (!noteInput) {
          say("You can look; notes need the review permission.", true);
          break;
        }
        noteInput.focus();
        break;
      case "?":
        toggleHelp();
        break;
      case "Escape":
        toggleHelp(false);
        toggleZoom(false);
        break;
      default:
        return;
    }
    event.preventDefault();
  });

  scrubber.addEventListener("input", () => go(Number(scrubber.value)));
  strip.addEventListener("click", (event) => {
    const thumb = event.target.closest(".thumb");
    if (thumb) go(Number(thumb.dataset.i));
  });
  document.querySelectorAll('[data-action="prev"]').forEach((b) => b.addEventListener("click", () => go(cursor - 1)));
  document.querySelectorAll('[data-action="next"]').forEach((b) => b.addEventListener("click", () => go(cursor + 1)));
  document.querySelectorAll('[data-action="help"]').forEach((b) => b.addEventListener("click", () => toggleHelp()));
  help.addEventListener("click", (event) => {
    if (event.target === help) toggleHelp(false);
  });
  if (flagButton) flagButton.addEventListener("click", toggleFlag);
  if (noteForm) {
    noteForm.addEventListener("submit", (event) => {
      event.preventDefault();
      saveNote();
    });
    noteInput.addEventListener("blur", saveNoteIfChanged);
  }

  document.querySelectorAll('[data-action="zoom"]').forEach((b) => b.addEventListener("click", () => toggleZoom(true)));
  document.querySelectorAll('[data-action="next-flagged"]').forEach((b) => b.addEventListener("click", () => seek(1, isFlagged)));
  document.querySelectorAll('[data-action="prev-flagged"]').forEach((b) => b.addEventListener("click", () => seek(-1, isFlagged)));
  mainImage.addEventListener("click", () => toggleZoom(true));
  zoom.addEventListener("click", () => toggleZoom(false));
  document.querySelectorAll(".achievement-link").forEach((link) =>
    link.addEventListener("click", (event) => {
      event.preventDefault();
      go(Number(link.dataset.turn));
    })
  );
  if (editor) {
    editor.addEventListener("click", (event) => {
      const button = event.target.closest("[data-pick]");
      if (button) pick(button.dataset.pick);
    });
    document.getElementById("relabel-save").addEventListener("click", saveRelabel);
    document.getElementById("relabel-cancel").addEventListener("click", closeEditor);
    document.getElementById("relabel-remove").addEventListener("click", () => sendRelabel({ remove: "1" }));
    document.getElementById("fork-with-correction").addEventListener("click", () => {
      forkCorrection.disabled = false;
      forkCorrection.checked = true;
      document.getElementById("fork-box").open = true;
      document.getElementById("fork-submit").focus();
    });
  }

  buildChart();
  cursor = Math.min(Math.max(Number(config.turnIndex) || 0, 0), turns.length - 1);
  render();
})();
