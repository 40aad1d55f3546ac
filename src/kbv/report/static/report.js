// kbv report: sort any table.sortable by a clicked header (every <tbody> is one unit, so a verdict's
// evidence row moves with it) and expand a verdict's row into its evidence. No dependencies.
(function () {
  "use strict";

  function sortKey(body, column) {
    var cell = body.rows[0] && body.rows[0].cells[column];
    if (!cell) return "";
    var key = cell.getAttribute("data-sort");
    return key === null ? cell.textContent.trim() : key;
  }

  function compare(a, b) {
    // empty keys last whatever the direction is handled by the caller; numbers as numbers
    var x = Number(a), y = Number(b);
    if (a !== "" && b !== "" && isFinite(x) && isFinite(y)) return x - y;
    return a.localeCompare(b, undefined, { numeric: true });
  }

  function sortBy(table, header, column) {
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    headersOf(table).forEach(function (th) { th.setAttribute("aria-sort", "none"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    var bodies = Array.prototype.slice.call(table.tBodies);
    bodies.sort(function (p, q) {
      var a = sortKey(p, column), b = sortKey(q, column);
      if (a === "" || b === "") return (a === "") - (b === "");
      return ascending ? compare(a, b) : compare(b, a);
    });
    bodies.forEach(function (body) { table.appendChild(body); });
  }

  function toggle(row) {
    var panel = document.getElementById(row.getAttribute("aria-controls"));
    if (!panel) return;
    panel.hidden = !panel.hidden;
    row.setAttribute("aria-expanded", panel.hidden ? "false" : "true");
  }

  function headersOf(table) {  // its own header row, not those of the tables inside its evidence
    return Array.prototype.slice.call(table.tHead.rows[0].cells);
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    headersOf(table).forEach(function (header, column) {
      header.addEventListener("click", function () { sortBy(table, header, column); });
    });
    table.addEventListener("click", function (event) {
      if (event.target.closest("a")) return;
      var row = event.target.closest("tr.row");
      if (row && table.contains(row)) toggle(row);
    });
    table.addEventListener("keydown", function (event) {
      var row = event.target.closest && event.target.closest("tr.row");
      if (row && (event.key === "Enter" || event.key === " ")) { event.preventDefault(); toggle(row); }
    });
  });
})();
