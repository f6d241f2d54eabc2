#!/usr/bin/env python3
"""The built site as a reader meets it: every page rendered in headless Chromium at a laptop's width (1366 x 900)
and a phone's (390 x 844), and what would get in a reader's way reported. Exits 1 and lists the problems, 0 when
there are none.

    python3 .ci/check_pages.py                           # builds the site into a temporary folder first
    python3 .ci/check_pages.py --shots /tmp/shots        # and saves a screenshot of each page at each width
    python3 .ci/check_pages.py --site site --pages results.html index.html

It needs Debian's `chromium` and `chromium-driver` (or any Chromium with its chromedriver on the PATH) and the
`selenium` package (requirements/dev.txt). Nothing is fetched: the site is read from disk (file://).

What counts as a problem, on each page at each width, with every collapsed block (`??? info`) opened:

- **Wider than the page**: the page scrolls sideways, or an element's right edge passes the viewport's. An element
  inside a box that scrolls sideways of its own (overflow-x auto or scroll: the wrapper mkdocs-material puts around
  every table, a code block, display math) is not: a reader scrolls that box, not the page. The box itself must fit.
- **An image that does not load**: loaded with no pixels (a wrong path, a missing file).
- **A figure's text too small**: a PNG that records its smallest font (benchmark/study/plotting.py writes
  `min-font-pt` and `dpi` into the file) drawn so small that this text is under MIN_TEXT_PX CSS pixels high.
  A figure without that record is listed as unchecked, not as a problem. An SVG figure (an `<img>` of one, the
  source a `<picture>` picks at that width included, or an `<svg>` in the page) is measured in the browser: the
  font size of each of its texts, as drawn at the figure's width on the page.
- **Inline code broken inside a word**: a `code` outside a code block wrapped between two letters or digits
  (`ppo_conti` / `nuous.py`) although it would fit on one line of the page: a table column squeezed to a few
  characters. Code longer than the page's line may wrap anywhere.
- **A command cut off** (on the laptop only): a command or flag in a table cell (inline code that starts with
  `python`, a script's name or `--`) whose text runs past the right edge of the table's scrolling box as the page
  first shows: what tells the rows apart needs a sideways scroll on a laptop's screen.

Screenshots (--shots DIR): DIR/<width>/<page>.png is the first screen, DIR/<width>/<page>.full.png the whole page
(up to MAX_SHOT_HEIGHT pixels), both as the page first shows, collapsed blocks closed.
"""

import argparse
import base64
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = {"laptop": (1366, 900), "phone": (390, 844)}
MIN_TEXT_PX = 9.0  # the smallest legible text in a figure, CSS pixels (the page's body text is 16)
MAX_SHOT_HEIGHT = 16000  # Chromium draws no taller screenshot reliably
CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--hide-scrollbars"]

# Runs in the page; returns [[kind, where, what], ...] and the images' sizes.
CHECK_JS = r"""
const [laptop, MIN_TEXT_PX] = arguments;
const vw = document.documentElement.clientWidth, problems = [], images = [];
const name = el => {
  let s = el.tagName.toLowerCase() + (el.id ? "#" + el.id : "");
  const heading = el.closest("h1,h2,h3,h4") ? null : [...document.querySelectorAll("h1,h2,h3,h4")]
      .filter(h => h.compareDocumentPosition(el) & Node.DOCUMENT_POSITION_FOLLOWING).pop();
  const text = (el.textContent || el.getAttribute("src") || "").trim().replace(/\s+/g, " ").slice(0, 60);
  return s + (heading ? " under '" + heading.textContent.replace("¶", "").trim().slice(0, 50) + "'" : "")
      + (text ? ": " + JSON.stringify(text) : "");
};
const boxed = el => { const s = getComputedStyle(el);  // a box whose overflow does not spill onto the page
  return ["auto", "scroll", "hidden", "clip"].includes(s.overflowX) || s.clip !== "auto"; };
const shown = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== "hidden";
document.querySelectorAll("details").forEach(d => d.open = true);
const page = document.scrollingElement;
if (page.scrollWidth > vw + 1) problems.push(["wide", "the page", `scrolls sideways: ${page.scrollWidth} px in a ${vw} px viewport`]);
const reported = [];
for (const el of document.body.querySelectorAll("*")) {
  if (!shown(el) || reported.some(r => r.contains(el))) continue;
  const r = el.getBoundingClientRect();
  if (r.width === 0 || r.right <= vw + 1) continue;
  let inside = false;  // inside a box that fits the page and scrolls (or is visually hidden: KaTeX's MathML)
  for (let box = el.parentElement; box && box !== document.body && !inside; box = box.parentElement) {
    const b = box.getBoundingClientRect();
    inside = boxed(box) && (b.right <= vw + 1 || b.width <= 2);
  }
  if (inside) continue;
  if (getComputedStyle(el).position === "fixed" && r.left >= vw) continue;  // an off-screen drawer
  reported.push(el);
  problems.push(["wide", name(el), `right edge at ${Math.round(r.right)} px in a ${vw} px viewport`]);
}
for (const img of document.querySelectorAll("img")) {
  if (!img.complete || img.naturalWidth === 0) { problems.push(["image", name(img), "did not load"]); continue; }
  const r = img.getBoundingClientRect();
  if (r.width > 0) images.push([img.getAttribute("src"), img.currentSrc, r.width, img.naturalWidth]);
}
const svgText = svg => {  // the smallest font of an SVG's texts, in CSS px as drawn
  let smallest = Infinity;
  for (const t of svg.querySelectorAll("text, tspan, textPath")) {
    if (![...t.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.data.trim())) continue;
    const m = t.getScreenCTM();
    if (!m) continue;
    smallest = Math.min(smallest, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b));
  }
  return smallest;
};
for (const svg of document.querySelectorAll(".md-content svg")) {
  if (!shown(svg) || svg.parentElement.closest("svg")) continue;
  const px = svgText(svg);
  if (px < MIN_TEXT_PX) problems.push(["figure", name(svg), `its smallest text is ${px.toFixed(1)} px high, under ${MIN_TEXT_PX}`]);
}
const command = /^(python3? |\S+\.py\b|--[a-z])/;
if (laptop) for (const code of document.querySelectorAll("td code, th code")) {
  if (!command.test(code.textContent.trim()) || !shown(code)) continue;
  let right = vw;  // what the boxes around it show of it, scrolled to their start
  for (let box = code.parentElement; box && box !== document.body; box = box.parentElement)
    if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(box).overflowX))
      right = Math.min(right, box.getBoundingClientRect().left + box.clientLeft + box.clientWidth);
  const r = code.getBoundingClientRect();
  if (r.right > right + 1)
    problems.push(["cut", name(code), `runs to ${Math.round(r.right)} px, the table shows it to ${Math.round(right)} px: it needs a sideways scroll`]);
}
const word = /[A-Za-z0-9_]/, line = (document.querySelector(".md-content__inner") || document.body).clientWidth;
for (const code of document.querySelectorAll("code")) {
  if (code.closest("pre") || code.getClientRects().length < 2) continue;
  const chars = [];
  const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
  for (let node; (node = walker.nextNode());) {
    for (let i = 0; i < node.data.length; i++) {
      const range = document.createRange();
      range.setStart(node, i); range.setEnd(node, i + 1);
      const rect = range.getClientRects()[0];
      if (rect) chars.push([node.data[i], rect.top]);
    }
  }
  const broken = chars.some((c, i) => i > 0 && Math.abs(c[1] - chars[i - 1][1]) > 2
                                      && word.test(c[0]) && word.test(chars[i - 1][0]));
  if (!broken) continue;
  const saved = code.style.whiteSpace;
  code.style.whiteSpace = "nowrap";
  const natural = code.getBoundingClientRect().width;
  code.style.whiteSpace = saved;
  if (natural <= line) problems.push(["code", name(code), `broken inside a word, ${Math.round(natural)} px on one line of ${line}`]);
}
return [problems, images];
"""


def png_text(path):
    """The tEXt entries of a PNG file ({key: value})."""
    found, data = {}, Path(path).read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return found
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            found[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"IEND":
            break
        pos += 12 + length
    return found


SVG_JS = r"""
const svg = document.documentElement, width = svg.getBoundingClientRect().width;
let smallest = Infinity;
for (const t of svg.querySelectorAll("text, tspan, textPath")) {
  if (![...t.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.data.trim())) continue;
  const m = t.getScreenCTM();
  if (m) smallest = Math.min(smallest, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b));
}
return isFinite(smallest) && width > 0 ? smallest / width : null;
"""


def svg_text(driver, path):
    """An SVG file's smallest font as a share of its width: opened on its own, each text's font size as drawn
    (its transforms and the viewBox's scale applied) over the width the whole drawing takes. Times the width a
    page draws it at, that text's height there in CSS px. An SVG without text: infinity."""
    driver.get(path.as_uri())
    ratio = driver.execute_script(SVG_JS)
    return float("inf") if ratio is None else float(ratio)


def build(site):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}")


def browser():
    """Headless Chromium driven by its chromedriver (none fetched: both must be installed)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        raise RuntimeError("needs chromium and chromedriver on the PATH (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def screenshot(driver, path, width, height, url, tries=3):
    """The page's top `height` pixels into `path`. Chromium now and then drops a capture on a loaded machine
    ("aborted by navigation"): the page is loaded again and the capture retried."""
    from selenium.common.exceptions import WebDriverException

    for attempt in range(tries):
        try:
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
            path.write_bytes(base64.b64decode(shot["data"]))
            return True
        except WebDriverException as error:
            if attempt == tries - 1:
                print(f"(no screenshot {path}: {str(error).splitlines()[0]})")
                return False
            driver.get(url)


def check(site, pages=None, shots=None, widths=WIDTHS):
    """[(width name, page, kind, where, what)] of every problem on the pages of the built `site`, and the figures
    that carry no record of their fonts."""
    site = Path(site).resolve()
    pages = pages or sorted(str(p.relative_to(site)) for p in site.rglob("*.html")
                            if p.name != "404.html" and "assets" not in p.parts)
    problems, unchecked, svg_ratios = [], set(), {}
    driver = browser()
    try:
        for label, (width, height) in widths.items():
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": height, "deviceScaleFactor": 1, "mobile": label == "phone"})
            for page in pages:
                url = (site / page).as_uri()
                driver.get(url)
                if shots:
                    out = Path(shots) / label / page
                    out.parent.mkdir(parents=True, exist_ok=True)
                    screenshot(driver, out.with_suffix(".png"), width, height, url)
                    full = driver.execute_script("return document.scrollingElement.scrollHeight")
                    screenshot(driver, out.with_suffix(".full.png"), width, min(full, MAX_SHOT_HEIGHT), url)
                found, images = driver.execute_script(CHECK_JS, label == "laptop", MIN_TEXT_PX)
                problems += [(label, page, *p) for p in found]
                for src, url, shown_width, natural in images:
                    if not url.startswith("file://"):
                        continue
                    path = Path(unquote(urlparse(url).path))
                    if path.suffix == ".svg":
                        if path not in svg_ratios:
                            svg_ratios[path] = svg_text(driver, path)
                        px = svg_ratios[path] * shown_width
                    elif path.suffix == ".png":
                        meta = png_text(path)
                        if "min-font-pt" not in meta:
                            unchecked.add(path.name)
                            continue
                        px = float(meta["min-font-pt"]) / 72 * float(meta["dpi"]) * shown_width / natural
                    else:
                        continue
                    if px < MIN_TEXT_PX:
                        problems.append((label, page, "figure", path.relative_to(site).as_posix(), f"its smallest text is {px:.1f} px high "
                                         f"(drawn {shown_width:.0f} px wide), under {MIN_TEXT_PX:g}"))
    finally:
        driver.quit()
    return problems, sorted(unchecked)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", help="a built site (default: build one into a temporary folder)")
    parser.add_argument("--shots", help="save screenshots here, a folder per width")
    parser.add_argument("--pages", nargs="*", help="only these pages, relative to the site (e.g. results.html)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            build(site)
        problems, unchecked = check(site, args.pages, args.shots)
    for label, page, kind, where, what in problems:
        print(f"{label:6} {page}: {kind}: {where}: {what}")
    if unchecked:
        print("figures with no record of their fonts (legibility not checked): " + ", ".join(unchecked))
    if args.shots:
        print(f"screenshots in {args.shots}/laptop and {args.shots}/phone")
    print(f"{len(problems)} problem(s)" if problems else "no problems at either width")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
