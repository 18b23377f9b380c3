// sluice web app: small enhancements; every page works without them.
"use strict";
(function () {
  // Forms that destroy something ask first.
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) {
      e.preventDefault();
    }
  });

  // Copy buttons: data-copy names the element whose text is copied.
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      var label = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = label; }, 1500);
    });
  });

  // Waterfall: drag a rung to reorder; the hidden order fields follow the list, and
  // "Save order" sends them (the up and down buttons work without this).
  document.querySelectorAll("ol[data-sortable]").forEach(function (list) {
    var dragged = null;
    list.addEventListener("dragstart", function (e) {
      dragged = e.target.closest("li");
      if (!dragged) return;
      dragged.classList.add("dragging");
      e.dataTransfer.effectAllowed = "move";
      e.dataTransfer.setData("text/plain", dragged.getAttribute("data-rung"));
    });
    list.addEventListener("dragend", function () {
      if (dragged) dragged.classList.remove("dragging");
      list.querySelectorAll(".drop-target").forEach(function (li) { li.classList.remove("drop-target"); });
      dragged = null;
    });
    list.addEventListener("dragover", function (e) {
      var over = e.target.closest("li");
      if (!dragged || !over || over === dragged) return;
      e.preventDefault();
      list.querySelectorAll(".drop-target").forEach(function (li) { li.classList.remove("drop-target"); });
      over.classList.add("drop-target");
    });
    list.addEventListener("drop", function (e) {
      var over = e.target.closest("li");
      if (!dragged || !over || over === dragged) return;
      e.preventDefault();
      var items = Array.prototype.slice.call(list.children);
      if (items.indexOf(dragged) < items.indexOf(over)) {
        over.after(dragged);
      } else {
        over.before(dragged);
      }
      over.classList.remove("drop-target");
      var save = list.closest("form").querySelector("[data-save-order]");
      if (save) save.classList.add("pending");
    });
  });
})();
