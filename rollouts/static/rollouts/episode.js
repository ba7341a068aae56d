// Episode viewer. The page carries a compact index of the turns (selectors_review.
// episode_index: frames, flags, errors, unlocks, vitals, in columns); each turn's texts come
// from its JSON view when the cursor reaches it, and its neighbours' are fetched ahead, so a
// key press shows a cached turn at once. Every string from a turn is model output: it is
// only ever set with textContent, never parsed as HTML.
(function () {
  "use strict";

  const indexNode = document.getElementById("turn-index");
  const configNode = document.getElementById("viewer-config");
  if (!indexNode || !configNode) return;
  const index = JSON.parse(indexNode.textContent);
  // What was recorded comes apart from the reviewers' flags (the server caches the first).
  const flagsNode = document.getElementById("turn-flags");
  index.flagged = flagsNode ? JSON.parse(flagsNode.textContent) : [];
  const config = JSON.parse(configNode.textContent);
  const count = index.count;
  if (!count) return;

  const SHA = /^[0-9a-f]{64}$/;
  // Per position (the cursor): the turn's index, its frame's step and sha256, and marks.
  const turnNumbers = index.turn;
  const steps = index.step;
  const frameBytes = atob(index.frames); // 32 bytes a turn, end to end
  const flagged = marks(index.flagged);
  const errors = marks(index.errors);
  const unlocks = marks(index.unlocks);
  const rewards = new Float64Array(count);
  for (const [p, reward] of index.reward) rewards[p] = Number(reward) || 0;

  // Turn details by position: the cursor's and its neighbours', a few requests at a time.
  const AHEAD = 8; // turns fetched ahead on either side of the cursor
  const CACHE_SIZE = 200;
  const MAX_LOADING = 4;
  // While the cursor sweeps (the scrubber dragged, a key held), fetch only where it rests.
  const SETTLE_MS = 60;
  let settle = 0;
  const details = new Map();
  const loading = new Map();
  const positionById = new Map();
  // Turns whose fetch failed: not asked again until the cursor comes back to them.
  const failed = new Set();

  const viewerNode = document.getElementById("viewer");
  const panel = document.getElementById("turn-panel");
  const mainImage = document.getElementById("frame-main");
  const scrubber = document.getElementById("scrubber");
  const position = document.getElementById("turn-pos");
  const strip = document.getElementById("filmstrip");
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
  const savedBox = document.getElementById("relabel-saved");
  const savedActions = document.getElementById("relabel-saved-actions");
  const pickedLabel = document.getElementById("relabel-picked-label");
  const saveButton = document.getElementById("relabel-save");
  const removeButton = document.getElementById("relabel-remove");
  const forkForm = document.getElementById("fork-form");
  const forkTurn = document.getElementById("fork-turn");
  const forkCorrection = document.getElementById("fork-correction");
  const keyActions = new Map((config.keys || []).map(([key, action]) => [key, action]));
  const MAX_RELABEL = 8;
  let picks = [];
  let editing = -1; // the position whose correction the editor holds
  let saved = null; // the correction stored for it, when it has one
  let cursor = 0;

  function marks(positions) {
    const marked = new Uint8Array(count);
    for (const p of positions) marked[p] = 1;
    return marked;
  }

  function frameSha(p) {
    let hex = "";
    for (let i = p * 32; i < p * 32 + 32; i++) hex += frameBytes.charCodeAt(i).toString(16).padStart(2, "0");
    return hex;
  }

  function frameUrl(sha) {
    return SHA.test(sha) ? config.frameUrl.replace("0".repeat(64), sha) : "";
  }

  // --- turn details: fetched by turn index, kept for the positions around the cursor ---

  function detailUrl(p) {
    return turnUrl(turnNumbers[p]);
  }

  function turnUrl(turnIndex) {
    return config.turnUrl.replace(/\/0\/$/, "/" + Number(turnIndex) + "/");
  }

  function load(p) {
    if (details.has(p)) return Promise.resolve(details.get(p));
    if (loading.has(p)) return loading.get(p);
    const request = fetch(detailUrl(p), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error("HTTP " + r.status))))
      .then((detail) => {
        remember(p, detail);
        if (p === cursor) renderDetail(detail);
        return detail;
      })
      .catch((error) => {
        failed.add(p);
        if (p === cursor) say("turn not loaded (" + error.message + ")", true);
        throw error;
      })
      .finally(() => {
        loading.delete(p);
        prefetch();
      });
    loading.set(p, request);
    return request;
  }

  function remember(p, detail) {
    details.set(p, detail);
    positionById.set(detail.id, p);
    while (details.size > CACHE_SIZE) {
      let farthest = p;
      for (const q of details.keys()) if (Math.abs(q - cursor) > Math.abs(farthest - cursor)) farthest = q;
      if (farthest === p) break;
      positionById.delete(details.get(farthest).id);
      details.delete(farthest);
    }
  }

  // The cursor's turn and its nearest neighbours not yet here, nearest first.
  function prefetch() {
    for (let d = 0; d <= AHEAD && loading.size < MAX_LOADING; d++) {
      for (const p of d ? [cursor + d, cursor - d] : [cursor]) {
        if (p < 0 || p >= count || details.has(p) || loading.has(p) || failed.has(p)) continue;
        if (loading.size >= MAX_LOADING) return;
        load(p).catch(() => {});
      }
    }
  }

  // Runs `action` with the cursor's turn once it is here (at once when it is cached).
  function withDetail(action) {
    const p = cursor;
    if (details.has(p)) return action(details.get(p), p);
    say("loading the turn…");
    load(p)
      .then((detail) => {
        if (cursor !== p) return;
        say("");
        action(detail, p);
      })
      .catch(() => {});
  }

  function idUrl(template, id) {
    // Templates are reversed with id 0: /turns/0/flag/ -> /turns/<id>/flag/
    return template.replace("/0/", "/" + Number(id) + "/");
  }

  // The filmstrip holds the thumbnails around the cursor, not one per turn: 10,000 buttons
  // would cost more than the page. It moves on when the cursor nears either end.
  const STRIP_AROUND = 40;
  let stripStart = 0;
  let stripThumbs = [];

  function thumbFor(p) {
    return p >= stripStart && p < stripStart + stripThumbs.length ? stripThumbs[p - stripStart] : null;
  }

  function markThumb(p) {
    const thumb = thumbFor(p);
    if (!thumb) return;
    thumb.classList.toggle("flagged", flagged[p] === 1);
    thumb.classList.toggle("has-error", errors[p] === 1);
    thumb.classList.toggle("has-unlock", unlocks[p] === 1);
    thumb.classList.toggle("current", p === cursor);
  }

  function buildThumb(p) {
    const thumb = document.createElement("button");
    thumb.type = "button";
    thumb.className = "thumb";
    thumb.dataset.i = String(p);
    thumb.title = "Turn " + turnNumbers[p] + " · step " + steps[p];
    const img = document.createElement("img");
    img.className = "pixel";
    img.loading = "lazy";
    img.width = 48;
    img.height = 48;
    img.alt = "";
    img.src = frameUrl(frameSha(p));
    const label = document.createElement("span");
    label.textContent = String(turnNumbers[p]);
    thumb.append(img, label);
    return thumb;
  }

  function renderFilmstrip() {
    const span = Math.min(count, 2 * STRIP_AROUND + 1);
    const end = stripStart + stripThumbs.length;
    const margin = STRIP_AROUND / 4;
    // Kept while the cursor is well inside it, or near an end of the episode it reaches.
    const keep =
      stripThumbs.length > 0 &&
      cursor >= stripStart &&
      cursor < end &&
      (cursor >= stripStart + margin || stripStart === 0) &&
      (cursor < end - margin || end === count);
    if (!keep) {
      stripStart = Math.min(Math.max(cursor - STRIP_AROUND, 0), count - span);
      stripThumbs = [];
      const fragment = document.createDocumentFragment();
      for (let p = stripStart; p < stripStart + span; p++) {
        const thumb = buildThumb(p);
        stripThumbs.push(thumb);
        fragment.appendChild(thumb);
      }
      strip.replaceChildren(fragment);
    }
    stripThumbs.forEach((_, i) => markThumb(stripStart + i));
    const current = thumbFor(cursor);
    if (current) current.scrollIntoView({ block: "nearest", inline: "center" });
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

  // The flag from the index (shown at once), the note from the turn's detail once here.
  function renderReview(p) {
    const isFlagged = flagged[p] === 1;
    if (flagButton) {
      flagButton.setAttribute("aria-pressed", isFlagged ? "true" : "false");
      flagButton.classList.toggle("on", flagged);
      flagButton.textContent = isFlagged ? "⚑ Flagged" : "⚐ Flag";
    }
    if (flagState) {
      flagState.textContent = isFlagged ? "⚑ flagged" : "not flagged";
      flagState.classList.toggle("warn", flagged);
    }
    const turn = details.get(p);
    if (noteInput) {
      // No note to edit until the turn's own is here: a blank box would overwrite it.
      noteInput.disabled = !turn;
      if (document.activeElement !== noteInput) noteInput.value = turn ? turn.note || "" : "";
    }
    if (noteReadonly) noteReadonly.textContent = turn ? turn.note || "" : "";
    markThumb(p);
  }

  function render() {
    const p = cursor;
    mainImage.src = frameUrl(frameSha(p));
    scrubber.value = String(p);
    position.textContent = p + 1 + " / " + count;
    setText("index", turnNumbers[p]);
    setText("step", steps[p]);
    setText("reward", "reward " + rewards[p].toFixed(2));
    if (forkTurn) forkTurn.value = String(turnNumbers[p]);
    renderFilmstrip();
    renderReview(p);
    moveChartCursor();
    if (!zoom.hidden) zoomImage.src = mainImage.src;
    history.replaceState(null, "", "?turn=" + p);
    // Warm the neighbours so that the next key press shows its frame at once.
    for (const q of [p - 1, p + 1]) {
      if (q >= 0 && q < count) new Image().src = frameUrl(frameSha(q));
    }
    // A turn already here shows at once; one that is not shows when it arrives (`load`).
    if (details.has(p)) renderDetail(details.get(p));
    else renderLoading();
    failed.delete(p);
    clearTimeout(settle);
    settle = setTimeout(prefetch, details.has(p) ? 0 : SETTLE_MS);
  }

  // Until the turn's detail is here: its texts blank, never the previous turn's.
  function renderLoading() {
    panel.classList.add("loading");
    panel.setAttribute("aria-busy", "true");
    for (const name of ["error", "error_kind", "tool_calls", "reasoning", "observation", "meta", "relabel_meta", "relabel_reason"]) setText(name, "");
    setText("model_text", "loading…");
    field("advantage").hidden = true;
    field("model_text").classList.add("muted");
    for (const name of ["actions", "unlocked", "vitals", "relabel", "seen"]) field(name).replaceChildren();
    for (const name of ["unlocked", "error", "tool_calls", "reasoning", "relabel"]) section(name, false);
    panel.querySelectorAll(".load-rest").forEach((node) => node.remove());
    if (forkCorrection) {
      forkCorrection.disabled = true;
      forkCorrection.checked = false;
    }
  }

  function renderDetail(turn) {
    panel.classList.remove("loading");
    panel.removeAttribute("aria-busy");
    chips("actions", turn.actions.length ? turn.actions : ["(none)"], "action");
    chips("unlocked", turn.unlocked, "ok");
    section("unlocked", turn.unlocked.length > 0);
    setText("error", turn.error);
    setText("error_kind", turn.error_kind);
    // A reinforcement-learning run's advantage: only its turns have one.
    const advantage = field("advantage");
    advantage.hidden = turn.advantage == null;
    setText("advantage", turn.advantage == null ? "" : "advantage " + Number(turn.advantage).toFixed(3));
    section("error", Boolean(turn.error));
    if (turn.model_text == null) {
      setText("model_text", "(no text)");
      field("model_text").classList.add("muted");
    } else {
      setText("model_text", turn.model_text);
      field("model_text").classList.remove("muted");
    }
    renderCalls(turn.calls);
    section("tool_calls", turn.calls.length > 0);
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
    renderReview(cursor);
  }

  // Each tool call: its name, then its arguments as indented JSON, or, when they are no
  // JSON, the text the model sent, marked (viewer.tool_call_shown). All of it is set as text.
  function renderCalls(calls) {
    const box = field("tool_calls");
    box.replaceChildren();
    for (const call of calls) {
      const item = document.createElement("div");
      item.className = "call" + (call.malformed ? " malformed" : "");
      const head = document.createElement("p");
      head.className = "call-head";
      const name = document.createElement("code");
      name.textContent = call.name || "(no name)";
      head.appendChild(name);
      if (call.id) {
        const id = document.createElement("small");
        id.className = "muted";
        id.textContent = " " + call.id;
        head.appendChild(id);
      }
      if (call.malformed) {
        const mark = document.createElement("span");
        mark.className = "chip warn";
        mark.textContent = "not JSON: the arguments as sent";
        head.append(" ", mark);
      }
      const args = document.createElement("pre");
      args.className = "code";
      args.textContent = call.arguments === "" ? "(empty)" : call.arguments;
      item.append(head, args);
      box.appendChild(item);
    }
  }

  // The rest of a long text: as text from its own view; tool calls as the viewer shows them,
  // from the turn's view uncut.
  function loadRest(turn, name) {
    if (name === "tool_calls") {
      const headers = { Accept: "application/json" };
      return fetch(turnUrl(turn.index) + "?whole=1", { credentials: "same-origin", headers: headers })
        .then((r) => (r.ok ? r.json() : Promise.reject(r.status)))
        .then((whole) => () => renderCalls(whole.calls));
    }
    const url = idUrl(config.textUrl, turn.id).replace("/model_text/", "/" + name + "/");
    return fetch(url, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(r.status)))
      .then((text) => () => {
        field(name).textContent = text;
      });
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
        loadRest(turn, name)
          .then((show) => {
            if (details.get(cursor) === turn) show();
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
      hint.textContent = "no action picked yet" + (saved ? ": the keys pick what replaces the saved correction" : "");
      picked.appendChild(hint);
    }
  }

  function openEditor() {
    if (!config.canReview || !editor) {
      say("You can look; relabeling needs the review permission.", true);
      return;
    }
    withDetail((turn, p) => {
      editing = p;
      // A turn corrected before: its correction is shown as saved, and the keys pick a new
      // one that replaces it (never appended to it, unless asked with "Start from it").
      saved = turn.relabel;
      picks = [];
      reasonInput.value = "";
      savedBox.hidden = !saved;
      savedActions.replaceChildren();
      for (const action of saved ? saved.actions : []) {
        const chip = document.createElement("span");
        chip.className = "chip action ok";
        chip.textContent = action;
        savedActions.appendChild(chip);
      }
      saveButton.textContent = saved ? "Replace correction" : "Save correction";
      pickedLabel.textContent = saved ? "Replacement:" : "Picked:";
      removeButton.hidden = !saved;
      editor.hidden = false;
      renderPicks();
      editor.scrollIntoView({ block: "nearest" });
    });
  }

  function startFromSaved() {
    if (!saved) return;
    picks = saved.actions.slice(0, MAX_RELABEL);
    reasonInput.value = saved.reason || "";
    renderPicks();
    editor.focus({ preventScroll: true }); // keys pick again, not press this button
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
    const turn = details.get(editing);
    if (!turn) return;
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
    const p = positionById.get(data.id);
    const target = details.get(p);
    if (target) target.relabel = data.relabel;
    closeEditor();
    if (target && p === cursor) renderRelabel(target);
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

  function seek(step, marked) {
    for (let i = cursor + step; i >= 0 && i < count; i += step) {
      if (marked[i] === 1) {
        go(i);
        return;
      }
    }
    say("no " + (step > 0 ? "later" : "earlier") + " turn of that kind");
  }

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
    const span = Math.max(count - 1, 1);
    return CHART.left + (i / span) * (CHART.w - CHART.left - CHART.right);
  }

  function buildChart() {
    if (!chart) return;
    const bottom = CHART.h - CHART.bottom;
    const height = bottom - CHART.top;
    const vitalY = (v) => bottom - (Math.max(0, Math.min(9, Number(v) || 0)) / 9) * height;
    let total = 0;
    const cumulative = Array.from(rewards, (reward) => (total += reward));
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
    caption.textContent = "turn 0 … " + (count - 1) + " · vitals 0–9 (left), cumulative reward (right)";
    chart.appendChild(caption);
    const line = (values, y, color, name) => {
      const points = values.map((v, i) => chartX(i).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
      chart.appendChild(svg("polyline", { points: points, fill: "none", stroke: color, "stroke-width": 1.4, "data-series": name }));
    };
    // One digit a turn per vital (selectors_review.episode_index).
    for (const [name, color] of SERIES) {
      const digits = (index.vitals || {})[name] || "";
      line(Array.from({ length: count }, (_, i) => (digits.charCodeAt(i) || 48) - 48), vitalY, color, name);
    }
    line(cumulative, rewardY, "#2f6f3e", "reward");
    chartCursor = svg("line", { y1: CHART.top - 4, y2: bottom, stroke: "#1d1d1f", "stroke-width": 1.2, "stroke-dasharray": "3 2", id: "chart-cursor" });
    chart.appendChild(chartCursor);
    chart.addEventListener("click", (event) => {
      const box = chart.getBoundingClientRect();
      const x = ((event.clientX - box.left) / box.width) * CHART.w;
      const span = CHART.w - CHART.left - CHART.right;
      go(Math.round(((x - CHART.left) / span) * Math.max(count - 1, 1)));
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

  function go(target) {
    const next = Math.min(Math.max(target, 0), count - 1);
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
    withDetail((turn, p) => {
      const wanted = flagged[p] !== 1;
      // Shown at once, confirmed or undone when the server answers.
      flagged[p] = wanted ? 1 : 0;
      turn.flagged = wanted;
      renderReview(p);
      say("saving…");
      htmx
        .ajax("POST", idUrl(config.flagUrl, turn.id), {
          source: flagButton,
          swap: "none",
          values: { flagged: wanted ? "1" : "0" },
        })
        .catch(() => {});
    });
  }

  function saveNote() {
    const turn = details.get(cursor);
    if (!config.canReview || !noteInput || !turn) return;
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
    const turn = details.get(cursor);
    if (noteInput && turn && noteInput.value.trim() !== (turn.note || "")) saveNote();
  }

  // Out of the note, back to the viewer's keys: the next `r` or `a` is a shortcut again, not
  // a letter of the note.
  function backToViewer() {
    if (viewerNode) viewerNode.focus({ preventScroll: true });
    else if (document.activeElement) document.activeElement.blur();
  }

  function toggleHelp(show) {
    help.hidden = show === undefined ? !help.hidden : !show;
  }

  document.body.addEventListener("studio:turn-reviewed", (event) => {
    const stored = event.detail || {};
    const p = positionById.get(stored.id);
    if (p === undefined) return;
    flagged[p] = stored.flagged ? 1 : 0;
    const turn = details.get(p);
    if (turn) {
      turn.flagged = Boolean(stored.flagged);
      if (pendingNotes.has(turn.id)) turn.note = pendingNotes.get(turn.id);
    }
    pendingNotes.delete(stored.id);
    if (p === cursor) {
      renderReview(p);
      say(stored.flagged ? "saved · flagged" : "saved");
    } else {
      markThumb(p);
    }
  });

  document.body.addEventListener("htmx:responseError", (event) => {
    const xhr = event.detail.xhr;
    const path = event.detail.requestConfig ? event.detail.requestConfig.path : "";
    const match = /\/turns\/(\d+)\/(flag|note)\//.exec(path || "");
    if (match) {
      const id = Number(match[1]);
      const p = positionById.get(id);
      if (p !== undefined && match[2] === "flag") {
        flagged[p] = flagged[p] === 1 ? 0 : 1;
        const turn = details.get(p);
        if (turn) turn.flagged = flagged[p] === 1;
        if (p === cursor) renderReview(p);
        else markThumb(p);
      }
      pendingNotes.delete(id);
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
        backToViewer();
      } else if (event.key === "Escape") {
        backToViewer();
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
        go(count - 1);
        break;
      case "f":
        toggleFlag();
        break;
      case "]":
        seek(1, flagged);
        break;
      case "[":
        seek(-1, flagged);
        break;
      case "e":
        seek(1, errors);
        break;
      case "E":
        seek(-1, errors);
        break;
      case "a":
        seek(1, unlocks);
        break;
      case "A":
        seek(-1, unlocks);
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
        // The box opens once the turn's own note is here (it is disabled until then).
        withDetail(() => noteInput.focus());
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
      backToViewer();
    });
    noteInput.addEventListener("blur", saveNoteIfChanged);
  }

  document.querySelectorAll('[data-action="zoom"]').forEach((b) => b.addEventListener("click", () => toggleZoom(true)));
  document.querySelectorAll('[data-action="next-flagged"]').forEach((b) => b.addEventListener("click", () => seek(1, flagged)));
  document.querySelectorAll('[data-action="prev-flagged"]').forEach((b) => b.addEventListener("click", () => seek(-1, flagged)));
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
    saveButton.addEventListener("click", saveRelabel);
    document.getElementById("relabel-extend").addEventListener("click", startFromSaved);
    document.getElementById("relabel-cancel").addEventListener("click", closeEditor);
    removeButton.addEventListener("click", () => sendRelabel({ remove: "1" }));
    document.getElementById("fork-with-correction").addEventListener("click", () => {
      forkCorrection.disabled = false;
      forkCorrection.checked = true;
      document.getElementById("fork-box").open = true;
      document.getElementById("fork-submit").focus();
    });
  }

  // A playing episode's live box asks every 2 s (episode_live). When more turns have been
  // recorded and the cursor is on the last one (and nothing is being typed), the viewer
  // follows: it opens at the newest turn. Elsewhere, the box only says how far it got.
  document.body.addEventListener("htmx:afterSettle", () => {
    const box = document.getElementById("episode-live");
    if (!box) return;
    const turns = Number(box.dataset.turns) || 0;
    const typing = document.activeElement && document.activeElement.matches("input, textarea");
    if (turns > count && cursor === count - 1 && !typing) {
      const url = new URL(window.location.href);
      url.searchParams.set("turn", String(turns - 1));
      window.location.replace(url.toString());
    }
  });

  buildChart();
  cursor = Math.min(Math.max(Number(config.turnIndex) || 0, 0), count - 1);
  render();
})();
