// What the pages' text needs from the browser, on every page (the styles are in stylesheets/extra.css):
// - inline code with a hyphen in it breaks only at its spaces: each word with a hyphen (a flag, --policy-buffer)
//   goes into a span that does not wrap, since a browser otherwise breaks after any hyphen ("--policy-" /
//   "buffer 8"); and where the whole code fits on one line of the page it does not break at all;
// - the reports' plain-text names (π_T, π_θ, μ_T, σ_T) show with a subscript, as the pages write them;
// - a table inside <div class="cards-on-phone"> becomes a card per row on a phone: each cell is labelled with
//   its column's heading (data-label), which the phone's style shows before the cell.
// Copying the text gives what the page's source holds: only the markup around it changes.
// document$ is Material's page-load observable (it also fires after instant navigation).
function readablePage(root) {
  root.querySelectorAll(".md-typeset code").forEach(function (code) {
    if (code.closest("pre") || code.children.length || code.textContent.indexOf("-") < 0) return;
    var parts = code.textContent.split(/(\s+)/);
    code.textContent = "";
    code.classList.add("flags");
    parts.forEach(function (part) {
      if (/^\s+$/.test(part)) part = " ";  // one space: the code keeps its spaces (pre-wrap), not its line breaks
      if (part.indexOf("-") < 0 || part.length > 40) { code.appendChild(document.createTextNode(part)); return; }
      var span = document.createElement("span");
      span.className = "nobr";
      span.textContent = part;
      code.appendChild(span);
    });
  });
  wholeWhereItFits(root);
  root.querySelectorAll(".cards-on-phone table").forEach(function (table) {
    var heads = Array.prototype.map.call(table.querySelectorAll("thead th"), function (th) {
      return th.textContent.trim();
    });
    table.querySelectorAll("tbody tr").forEach(function (row) {
      Array.prototype.forEach.call(row.children, function (cell, i) {
        if (heads[i]) cell.setAttribute("data-label", heads[i]);
      });
    });
  });
  var subscript = /([πμσ])_(T|θ)/;
  var walker = document.createTreeWalker(root.querySelector(".md-content") || root, NodeFilter.SHOW_TEXT);
  var found = [];
  for (var node; (node = walker.nextNode());) {
    if (subscript.test(node.data) && !node.parentElement.closest("code, pre, .katex, .arithmatex, script")) found.push(node);
  }
  found.forEach(function (node) {
    var pieces = node.data.split(/([πμσ]_(?:T|θ))/), fragment = document.createDocumentFragment();
    pieces.forEach(function (piece) {
      if (!subscript.test(piece)) { fragment.appendChild(document.createTextNode(piece)); return; }
      fragment.appendChild(document.createTextNode(piece[0]));
      var sub = document.createElement("sub");
      sub.textContent = piece.slice(2);
      fragment.appendChild(sub);
    });
    node.parentNode.replaceChild(fragment, node);
  });
}
// Inline code that fits on one line of the page does not break at all: it moves to the next line whole.
function wholeWhereItFits(root) {
  root.querySelectorAll(".md-typeset code.flags").forEach(function (code) {
    var block = code.closest("p, li, td, th, dd, dt, h1, h2, h3, h4, summary, div") || root;
    code.classList.add("nobr");
    var width = code.getBoundingClientRect().width;  // 0 in a closed fold: judged by its length there
    if (width > block.clientWidth || (width === 0 && code.textContent.length > 36)) code.classList.remove("nobr");
  });
}
window.addEventListener("resize", function () { wholeWhereItFits(document.body); });
document.addEventListener("toggle", function (event) { wholeWhereItFits(document.body); }, true);
if (typeof document$ !== "undefined") {
  document$.subscribe(function ({ body }) { readablePage(body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { readablePage(document.body); });
}
