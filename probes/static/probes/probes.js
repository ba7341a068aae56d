// A probe run's answers under review, with the episode viewer's keys: ← → move from answer to
// answer (past the page's last or first, to the next or previous page), f flags, n writes a
// note (Ctrl+Enter saves, Esc leaves), ? lists the keys. Flags and notes go through htmx, as
// the buttons and forms on each answer send them.
(function () {
  "use strict";
  const list = document.getElementById("answer-list");
  const help = document.getElementById("help");
  const cards = list ? Array.from(list.querySelectorAll("[data-answer]")) : [];
  let cursor = -1;

  function select(i) {
    if (!cards.length) return;
    const next = Math.min(Math.max(i, 0), cards.length - 1);
    if (cursor >= 0) cards[cursor].classList.remove("current");
    cursor = next;
    const card = cards[cursor];
    card.classList.add("current");
    card.focus({ preventScroll: true });
    card.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    const target = cursor + step;
    if (target >= cards.length && list.dataset.next) {
      window.location.href = list.dataset.next + "#first";
    } else if (target < 0 && cursor >= 0 && list.dataset.previous) {
      window.location.href = list.dataset.previous + "#last";
    } else {
      select(cursor < 0 ? 0 : target);
    }
  }

  function current() {
    if (cursor < 0) select(0);
    return cursor >= 0 ? cards[cursor] : null;
  }

  function toggleHelp(show) {
    if (help) help.hidden = show === undefined ? !help.hidden : !show;
  }

  document.addEventListener("keydown", function (event) {
    const typing = event.target.closest && event.target.closest("input, textarea, select");
    if (typing) {
      if (typing.tagName === "TEXTAREA") {
        const card = typing.closest("[data-answer]");
        if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
          event.preventDefault();
          typing.form.requestSubmit();
          if (card) card.focus({ preventScroll: true });
        } else if (event.key === "Escape" && card) {
          card.focus({ preventScroll: true });
        }
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    let card;
    switch (event.key) {
      case "ArrowRight":
        move(1);
        break;
      case "ArrowLeft":
        move(-1);
        break;
      case "f":
        card = current();
        if (card && card.querySelector("[data-flag]")) card.querySelector("[data-flag]").click();
        break;
      case "n":
        card = current();
        if (card && card.querySelector("textarea")) card.querySelector("textarea").focus();
        break;
      case "?":
        toggleHelp();
        break;
      case "Escape":
        toggleHelp(false);
        break;
      default:
        return;
    }
    event.preventDefault();
  });

  cards.forEach(function (card, i) {
    card.addEventListener("click", function (event) {
      if (!event.target.closest("a, button, textarea, summary")) select(i);
      else if (cursor !== i) {
        if (cursor >= 0) cards[cursor].classList.remove("current");
        cursor = i;
        card.classList.add("current");
      }
    });
  });
  // The card shows its flag as the server stored it (each flag button is swapped for the
  // stored answer's).
  document.body.addEventListener("htmx:afterSettle", function () {
    cards.forEach(function (card) {
      const button = card.querySelector("[data-flag]");
      if (button) card.classList.toggle("flagged", button.getAttribute("aria-pressed") === "true");
    });
  });
  document.body.addEventListener("htmx:responseError", function (event) {
    const card = event.detail.elt && event.detail.elt.closest ? event.detail.elt.closest("[data-answer]") : null;
    const status = card ? card.querySelector(".note-status") : null;
    const xhr = event.detail.xhr;
    if (status) status.textContent = "not saved (" + xhr.status + (xhr.status === 403 ? ": no permission" : "") + ")";
  });
  document.querySelectorAll('[data-action="help"]').forEach(function (b) {
    b.addEventListener("click", function () { toggleHelp(); });
  });
  if (help) help.addEventListener("click", function (event) { if (event.target === help) toggleHelp(false); });
  if (window.location.hash === "#first") select(0);
  else if (window.location.hash === "#last") select(cards.length - 1);
})();
