// Render the math that pymdownx.arithmatex (generic mode) leaves in the page:
// <span class="arithmatex">\(...\)</span> inline, <div class="arithmatex">\[...\]</div> display.
// KaTeX is vendored in javascripts/katex/, so this works offline.
// document$ is Material's page-load observable (it also fires after instant navigation).
function renderMath(root) {
  root.querySelectorAll(".arithmatex").forEach(function (el) {
    var tex = el.textContent.trim();
    var display = el.tagName === "DIV";
    if (/^\\[\(\[]/.test(tex)) tex = tex.slice(2, -2);  // strip \( \) or \[ \]
    katex.render(tex, el, { displayMode: display, throwOnError: false });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function ({ body }) { renderMath(body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { renderMath(document.body); });
}
