"""The documentation site (mkdocs.yml, docs/): it builds with --strict, and what it shows of the
code cannot drift from the code.

Code excerpts are included from the scripts with pymdownx.snippets. A script marks a region with
two comment lines, `# --8<-- [start:NAME]` and `# --8<-- [end:NAME]`; a page includes it with a
fenced python block whose only line is `--8<-- "script.py:NAME"`. The build fails on a missing
file or section (check_paths), but a marker left without its end, or a section emptied by an
edit, would still render (wrongly) or render nothing, so these tests check the markers and the
includes themselves, and then what the built pages show.
"""

import ast
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.floatfree  # the site and its pages: no float computed by torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
SCRIPTS = sorted(ROOT.glob("*.py"))
# Pages that document a script completely: every option with its default, every logged metric.
REFERENCE_PAGES = {"ppo_continuous.py": "ppo_continuous.md", "decoupled_ppo_continuous.py": "decoupled_ppo_continuous.md",
                   "vaco_continuous.py": "vaco_continuous.md"}
# Pages whose option table lists every option with its default (the metrics of the GRPO script are
# logged under computed names, so its page is checked for its options only).
OPTION_PAGES = {**REFERENCE_PAGES, "grpo_vaco_gsm8k.py": "grpo_vaco_gsm8k.md"}

# A section marker: a comment line of its own (`# ...` in Python, `<!-- ... -->` in Markdown).
MARKER = re.compile(r"^\s*(?:#|<!--)\s*--8<--\s*\[(start|end):([a-z][a-z0-9_]*)\]\s*(?:-->)?\s*$")
# An include: a line of its own, `--8<-- "path"` or `--8<-- "path:section"` (`;--8<--` escapes it).
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
SECTION_NAME = re.compile(r"[a-z][a-z0-9_]*")


def read(path):
    return Path(path).read_text(encoding="utf-8")


def sections(path):
    """{name: lines} of the sections marked in a file; asserts that the markers are well formed."""
    found, open_name, seen = {}, None, set()
    for lineno, line in enumerate(read(path).splitlines(), 1):
        if "--8<-- [" not in line or ";--8<--" in line:
            if open_name is not None:
                found[open_name].append(line)
            continue
        where = f"{Path(path).relative_to(ROOT)}:{lineno}"
        m = MARKER.match(line)
        assert m, f"{where}: malformed section marker {line.strip()!r} (want `# --8<-- [start:name]`, name in [a-z0-9_])"
        kind, name = m.groups()
        if kind == "start":
            assert open_name is None, f"{where}: section {name!r} starts inside section {open_name!r}"
            assert name not in seen, f"{where}: section {name!r} is marked twice in this file"
            open_name = name
            seen.add(name)
            found[name] = []
        else:
            assert open_name == name, f"{where}: end of {name!r} without its start (open: {open_name!r})"
            open_name = None
    assert open_name is None, f"{Path(path).relative_to(ROOT)}: section {open_name!r} has no end marker"
    return found


def includes():
    """(page, lineno, path, section or None) for every include line in the docs."""
    out = []
    for page in PAGES:
        for lineno, line in enumerate(read(page).splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target, section = m.group(1), None
            head, _, tail = target.rpartition(":")
            if head and SECTION_NAME.fullmatch(tail):
                target, section = head, tail
            out.append((page, lineno, target, section))
    return out


def marked_files():
    return [p for p in SCRIPTS + PAGES if "--8<-- [" in read(p)]


def test_markers_are_well_formed_comment_lines():
    files = marked_files()
    assert any(p.suffix == ".py" for p in files), "no script has section markers: the docs quote no code"
    for path in files:
        sections(path)  # asserts


def test_every_included_file_and_section_exists_and_is_not_empty():
    found = includes()
    assert len([i for i in found if i[3]]) >= 10, "the script pages should include their code excerpts"
    for page, lineno, target, section in found:
        where = f"{page.relative_to(ROOT)}:{lineno}"
        assert not re.search(r":-?\d", target), (
            f"{where}: {target!r} includes a line range, which drifts silently; mark a section instead"
        )
        path = ROOT / target
        assert path.is_file(), f"{where}: {target} does not exist (paths are relative to the repository root)"
        if section:
            marked = sections(path)
            assert section in marked, f"{where}: {target} has no section {section!r} (it has {sorted(marked)})"
            assert any(line.strip() for line in marked[section]), f"{where}: section {target}:{section} is empty"


def test_every_marked_section_is_included_somewhere():
    """Markers cost the script's reader a line each: none without a page that shows it."""
    used = {(target, section) for _, _, target, section in includes() if section}
    for path in marked_files():
        rel = path.relative_to(ROOT).as_posix()
        for name in sections(path):
            assert (rel, name) in used, f"section {rel}:{name} is marked but no page includes it"


def test_python_code_in_the_docs_is_included_not_copied():
    fence = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(\w*)")
    for page in PAGES:
        lines, i = read(page).splitlines(), 0
        while i < len(lines):
            m = fence.match(lines[i])
            if not m:
                i += 1
                continue
            indent, marker, lang = m.groups()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(marker):
                j += 1
            body = [line for line in lines[i + 1 : j] if line.strip()]
            if lang in ("python", "py"):
                copied = [line for line in body if not INCLUDE.match(line)]
                assert not copied, (
                    f"{page.relative_to(ROOT)}:{i + 1}: a python block with code written into the page "
                    f"({copied[0].strip()!r}); mark a section in the script and include it"
                )
            i = j + 1


# ---- Markdown that renders other than it reads -------------------------------------------------

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
# Lines that are blocks of their own, not paragraph text: a list may follow them directly.
# Headings, table rows, HTML (comments, <details>), admonitions and tabs, display math, rules,
# block quotes, attribute lists and the end of a fence.
NOT_PARAGRAPH = re.compile(r"^\s*(?:#|\||<|!!!|\?\?\?|===|\$\$|---|\*\*\*|___|>|\{|`{3}|~{3})")
# Files that a page includes and another change replaces; each entry names the known problem.
# Remove an entry as soon as its file is fixed (the test then fails if the entry is stale).
LIST_AFTER_PARAGRAPH_KNOWN: set = set()


def file_lines(path, section=None):
    """(text, "file:line") of a file's lines, or of one marked section's; marker lines dropped, as
    pymdownx.snippets drops them."""
    rel, out, inside = Path(path).relative_to(ROOT).as_posix(), [], section is None
    for lineno, line in enumerate(read(path).splitlines(), 1):
        m = MARKER.match(line) if "--8<-- [" in line and ";--8<--" not in line else None
        if m:
            if section is not None and m.group(2) == section:
                inside = m.group(1) == "start"
            continue
        if inside:
            out.append((line, f"{rel}:{lineno}"))
    return out


def as_markdown_reads(path, section=None, depth=0):
    """The lines of a page as Markdown receives them after pymdownx.snippets: every include of a
    Markdown file replaced by its lines (indented like the include line), recursively, each with the
    file:line it is written at. Includes of code (.py) stand in as one line: they sit in fences."""
    assert depth < 5, f"{path}: includes nested too deep (a cycle?)"
    out = []
    for line, origin in file_lines(path, section):
        m = INCLUDE.match(line)
        if not m:
            out.append((line, origin))
            continue
        indent = line[: len(line) - len(line.lstrip())]
        target, section_name = m.group(1), None
        head, _, tail = target.rpartition(":")
        if head and SECTION_NAME.fullmatch(tail):
            target, section_name = head, tail
        if not target.endswith(".md"):
            out.append((indent + "(code)", origin))
            continue
        out += [(indent + text if text.strip() else text, where)
                for text, where in as_markdown_reads(ROOT / target, section_name, depth + 1)]
    return out


def lists_after_paragraphs(lines):
    """(origin, item) of every list item written on the line after paragraph text. Python-Markdown
    starts a list only after a blank line (or a block such as a heading or a table): without one the
    items run on as text of the paragraph. Lines in fences and display math are skipped; a list item
    after a list item, or after a continuation line of one, is a list going on."""
    found, fence, math, prev, after_blank, list_indent = [], None, False, None, True, None
    for text, origin in lines:
        stripped, indent = text.strip(), len(text) - len(text.lstrip())
        if fence:
            if re.fullmatch(rf"{re.escape(fence[0])}{{{len(fence)},}}", stripped):
                fence, prev = None, "```"
            continue
        if math:
            math, prev = stripped != "$$", "$$"
            continue
        if not stripped:
            prev, after_blank = None, True
            continue
        m = FENCE.match(text)
        if m:
            fence, prev, after_blank = m.group(1), "```", False
            continue
        if stripped == "$$":
            math = True
            continue
        if LIST_ITEM.match(text):
            if prev is not None and list_indent is None and not NOT_PARAGRAPH.match(prev):
                found.append((origin, stripped))
            if list_indent is None:
                list_indent = indent
        elif list_indent is not None and after_blank and indent <= list_indent:
            list_indent = None  # a block at the list's level after a blank line: the list has ended
        prev, after_blank = text, False
    return found


@pytest.mark.parametrize("text, flagged", [
    ("Text:\n- a\n- b", ["- a"]),
    ("    Text in an admonition:\n    1. a", ["1. a"]),
    ("Text:\n\n- a\n- b\n  wrapped\n- c", []),  # blank line; items and their continuation lines
    ("- a\nlazy continuation\n- b\n\n  para of b\n  - nested", []),
    ("```text\nText:\n- a\n```\n- after a fence", []),
    ("| a | b |\n|-|-|\n- after a table", []),
    ("## Heading\n- a\n\n<!-- comment -->\n- b", []),
    ("- a\n\nNew paragraph:\n- b", ["- b"]),  # the list ended with its blank line
    ("$$\nx\n- y\n$$", []),
])
def test_the_list_check_itself(text, flagged):
    assert [item for _, item in lists_after_paragraphs([(line, "") for line in text.splitlines()])] == flagged


def test_no_list_directly_follows_a_paragraph():
    """A list written on the line after a paragraph renders as one run-on paragraph; checked in every
    page as Markdown reads it, with every included Markdown file in place."""
    bad, known = [], set()
    for page in PAGES:
        for origin, item in lists_after_paragraphs(as_markdown_reads(page)):
            file = origin.rsplit(":", 1)[0]
            if file in LIST_AFTER_PARAGRAPH_KNOWN:
                known.add(file)
            else:
                bad.append(f"{origin}: {item!r} (in {page.relative_to(ROOT)})")
    assert not bad, "a list directly after a paragraph line (add a blank line before it):\n" + "\n".join(bad)
    stale = LIST_AFTER_PARAGRAPH_KNOWN - known
    assert not stale, f"fixed, or no longer included: remove {sorted(stale)} from LIST_AFTER_PARAGRAPH_KNOWN"


# ---- the script pages: every option with its default, every logged metric ----------------------


# Where a reader finds the benchmarks' commands: the pages, the READMEs and CONTRIBUTING.md.
COMMAND_FILES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmark" / "README.md", *PAGES]
BENCHMARK_COMMAND = re.compile(r"python3? (benchmark/[\w/]+\.py)(.*)")


def benchmark_commands():
    """{script: [(where, [its flags])]} of every `python benchmark/...py` command in COMMAND_FILES, in code blocks
    (continued lines joined) and inline code. Flags: the words of the command that start with --, before a bare --
    (after it: the flags of the script it runs) or the end of the command; quoted words are another script's."""
    found = {}
    for path in COMMAND_FILES:
        text = read(path)
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for chunk in blocks + inline:
            for line in chunk.replace("\\\n", " ").splitlines():
                for m in BENCHMARK_COMMAND.finditer(line):
                    words = shlex.split(m.group(2).replace(";--8<--", ""), comments=True)
                    flags = []
                    for word in words:
                        if word in ("--", "&&", "&", ";", "|"):
                            break
                        if word.startswith("--") and " " not in word:
                            flags.append(word.split("=")[0])
                    found.setdefault(m.group(1), []).append((path.relative_to(ROOT), flags))
    return found


def test_every_benchmark_command_in_the_docs_names_a_script_and_options_it_has():
    """A benchmark moved, renamed or given other options fails here, not in a reader's shell: each command's script
    exists, and its --help lists each option the command passes."""
    commands = benchmark_commands()
    assert len(commands) >= 15, sorted(commands)
    for script, uses in commands.items():
        assert (ROOT / script).is_file(), f"{uses[0][0]}: {script} does not exist"

    def help_text(script):
        result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300, env={**os.environ, "COLUMNS": "200"})
        assert result.returncode == 0, f"{script} --help: {result.stderr[-2000:]}"
        return result.stdout

    with ThreadPoolExecutor(4) as pool:
        helps = dict(zip(commands, pool.map(help_text, commands)))
    for script, uses in commands.items():
        for where, flags in uses:
            for flag in flags:
                assert re.search(re.escape(flag) + r"(?![\w-])", helps[script]), \
                    f"{where}: {script} has no option {flag}"


def not_an_option(value):
    """A dataclass field that the command line cannot set: `field(..., init=False)`."""
    return (isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field"
            and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in value.keywords))


def script_options(script):
    """{--flag: default} of the script's Args dataclass; default is ... when it is not a literal. Fields the script
    computes at the start (`field(init=False)`, or documented as computed in runtime) are not options."""
    tree = ast.parse(read(ROOT / script))
    args = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args")
    options, body = {}, args.body
    for k, node in enumerate(body):
        if not isinstance(node, ast.AnnAssign):
            continue
        doc = body[k + 1].value.value if k + 1 < len(body) and isinstance(body[k + 1], ast.Expr) else ""
        if "computed in runtime" in str(doc) or not_an_option(node.value):
            continue
        try:
            default = ast.literal_eval(node.value)
        except ValueError:
            default = ...
        options["--" + node.target.id.replace("_", "-")] = default
    return options


def page_option_rows(page):
    """{--flag: default cell} of the rows of a page's tables whose first cell is one `--flag`."""
    rows = {}
    for line in read(DOCS / page).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) >= 2 and re.fullmatch(r"`--[a-z0-9-]+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def same_default(cell, default):
    if default is ...:
        return True  # computed (e.g. the file name): described in words
    if default is None or isinstance(default, bool):
        return cell == str(default)
    if isinstance(default, (int, float)):
        try:
            return float(cell) == float(default)
        except ValueError:
            return False
    return cell.strip("\"'") == str(default)


@pytest.mark.parametrize("script", sorted(OPTION_PAGES))
def test_script_page_lists_every_option_with_its_default(script):
    options, rows = script_options(script), page_option_rows(OPTION_PAGES[script])
    assert len(options) > 20
    missing = sorted(set(options) - set(rows))
    assert not missing, f"docs/{OPTION_PAGES[script]} has no table row for {missing}"
    unknown = sorted(set(rows) - set(options))
    assert not unknown, f"docs/{OPTION_PAGES[script]} documents options {script} does not have: {unknown}"
    wrong = {flag: (rows[flag], options[flag]) for flag in options if not same_default(rows[flag], options[flag])}
    assert not wrong, f"docs/{OPTION_PAGES[script]}: defaults (page, script) differ: {wrong}"


def script_metrics(script):
    """Every TensorBoard tag the script logs: literal add_scalar tags, plus losses/<key> for the
    per-minibatch statistics (the keywords of `stats = dict(...)` and `stats.update(...)`, or
    `stats["key"]`) that one f"losses/{name}" loop logs."""
    source = read(ROOT / script)
    calls = re.findall(r"add_scalar\(\s*(f?)\"([^\"]+)\"", source)
    tags = {tag for f, tag in calls if not f}
    formatted = {tag for f, tag in calls if f}
    assert formatted <= {"losses/{name}"}, f"{script} logs tags this test cannot read: {formatted}"
    if formatted:
        tags |= {f"losses/{key}" for key in re.findall(r'stats\["(\w+)"\]', source)}
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["stats"] \
                    and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict":
                tags |= {f"losses/{k.arg}" for k in node.value.keywords}
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                    and getattr(node.func.value, "id", None) == "stats":
                tags |= {f"losses/{k.arg}" for k in node.keywords}
    return tags


@pytest.mark.parametrize("script", sorted(REFERENCE_PAGES))
def test_script_page_lists_every_logged_metric(script):
    tags, text = script_metrics(script), read(DOCS / REFERENCE_PAGES[script])
    assert len(tags) > 10
    missing = sorted(tag for tag in tags if f"`{tag}`" not in text)
    assert not missing, f"docs/{REFERENCE_PAGES[script]} does not describe the metrics {missing}"
    named = set(re.findall(r"`((?:charts|losses|eval)/\w+)`", text))
    stale = sorted(named - tags)
    assert not stale, f"docs/{REFERENCE_PAGES[script]} names metrics {script} does not log: {stale}"


# ---- the built site ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """`mkdocs build --strict` into a temporary folder (never into the repository)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=out, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def built_page(site, page):
    return site / page.relative_to(DOCS).with_suffix(".html")


def page_text(path):
    return html.unescape(re.sub(r"<[^>]+>", "", read(path)))


def test_the_site_builds_strict_with_every_page_in_the_nav(site):
    for page in PAGES:
        assert built_page(site, page).is_file(), f"{page.relative_to(ROOT)} was not built"
    nav = read(site / "index.html")
    for page in PAGES:
        assert f'href="{page.relative_to(DOCS).with_suffix(".html").as_posix()}"' in nav or page.name == "index.md", (
            f"{page.relative_to(ROOT)} is not in the navigation (mkdocs.yml nav)"
        )


def toc_entries(path):
    """The titles in a built page's table of contents (Material: the links to #anchors of the page)."""
    links = re.findall(r'<a href="#[^"]*" class="md-nav__link">\s*<span class="md-ellipsis">(.*?)</span>', read(path), re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", title)).split()) for title in links]


def test_no_heading_appears_twice_in_a_pages_table_of_contents(site):
    """Headings repeat when a page includes two sections that carry the same heading (e.g. two
    reports' tables); the page gives each its own heading, the included sections carry none."""
    assert len(toc_entries(site / "results" / "speed.html")) > 5, "the table of contents was not found in the built page"
    for page in PAGES:
        titles = toc_entries(built_page(site, page))
        twice = sorted({t for t in titles if titles.count(t) > 1})
        assert not twice, f"{page.relative_to(ROOT)}: headings twice in the table of contents: {twice}"


def test_built_pages_show_the_code_of_each_included_section(site):
    for page, _, target, section in includes():
        if not target.endswith(".py"):
            continue  # Markdown renders to something else; its sections are checked above
        lines = sections(ROOT / target)[section] if section else read(ROOT / target).splitlines()
        first = next(line.strip() for line in lines if line.strip() and "--8<--" not in line)
        text = page_text(built_page(site, page))
        assert first in text, f"{page.relative_to(ROOT)}: the built page lacks {target}:{section} ({first!r})"


def test_the_site_loads_nothing_from_the_internet(site):
    """Offline readers (and offline CI screenshots) get every script, style, font and image."""
    remote = re.compile(r"""<(?:script|img|iframe)\b[^>]*\bsrc=["']?(?:https?:)?//|<link\b[^>]*\bhref=["']?(?:https?:)?//""")
    for path in site.rglob("*.html"):
        found = remote.search(read(path))
        assert not found, f"{path.relative_to(site)} loads a remote resource: {found.group(0)}"
    for path in site.rglob("*.css"):
        found = re.search(r"url\(\s*[\"']?(?:https?:)?//[^)]*\)", read(path))
        assert not found, f"{path.relative_to(site)} loads a remote resource: {found.group(0)}"


def math_in(site):
    """(page, tex, display) of every formula arithmatex left for the renderer."""
    out = []
    for path in sorted(site.rglob("*.html")):
        for tag, tex in re.findall(r'<(span|div) class="arithmatex">(.*?)</\1>', read(path), re.S):
            tex = html.unescape(tex).strip()
            out.append((path.relative_to(site).as_posix(), tex[2:-2] if tex[:2] in ("\\(", "\\[") else tex, tag == "div"))
    return out


def test_pages_with_math_load_the_vendored_renderer(site):
    formulas = math_in(site)
    assert len(formulas) > 50, "the method pages should carry their equations"
    for name in sorted({page for page, _, _ in formulas}):
        source = read(site / name)
        assert "javascripts/katex/katex.min.js" in source and "javascripts/math.js" in source, name
    assert (site / "javascripts" / "katex" / "fonts" / "KaTeX_Main-Regular.woff2").is_file()


def test_every_formula_renders_with_the_vendored_katex(site, tmp_path):
    """Renders each formula with the same KaTeX the pages load (needs node; skipped without it)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: formulas are only checked by the strict build")
    formulas = math_in(site)
    (tmp_path / "formulas.json").write_text(json.dumps([[tex, display] for _, tex, display in formulas]))
    check = (
        "const katex = require(process.argv[1]);"
        "const formulas = JSON.parse(require('fs').readFileSync(process.argv[2], 'utf8'));"
        "const bad = [];"
        "for (const [tex, displayMode] of formulas) {"
        "  try { katex.renderToString(tex, {displayMode, throwOnError: true}); }"
        "  catch (e) { bad.push(tex + '  -->  ' + e.message); } }"
        "console.log(JSON.stringify(bad));"
    )
    proc = subprocess.run(
        [node, "-e", check, str(DOCS / "javascripts" / "katex" / "katex.min.js"), str(tmp_path / "formulas.json")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    bad = json.loads(proc.stdout)
    assert not bad, "formulas KaTeX cannot render:\n" + "\n".join(bad)


def test_search_leaves_out_the_whole_scripts(site):
    """The collapsed "The whole script" blocks would otherwise be the top hit of every search for a
    name in the code; the heading carries data-search-exclude, which drops its section from the
    index. Every page that includes a whole script has the heading, and the index holds none of
    the script's main guard (which no page includes as a section)."""
    index = json.loads(read(site / "search" / "search_index.json"))["docs"]
    whole = [(page, m.group(1)) for page in PAGES for m in re.finditer(r'--8<-- "([\w./]+\.py)"', read(page))]
    assert len(whole) >= 4, whole
    for page, script in whole:
        location = page.relative_to(DOCS).with_suffix(".html").as_posix()
        assert "## The whole script { data-search-exclude }" in read(page), f"{location}: no excluded heading"
        entries = [e for e in index if e["location"].split("#")[0] == location]
        assert entries, f"{location} is not in the search index at all"
        assert not any(e["location"].endswith("#the-whole-script") for e in entries), location
        assert not any("__main__" in e["text"] for e in entries), f"{location}: {script} is indexed"


# ---- the README and the results pages as a reader meets them -----------------------------------

README = ROOT / "README.md"
SUMMARY = DOCS / "results.md"
RESULT_PAGES = sorted((DOCS / "results").glob("*.md"))
REPORTS = sorted((ROOT / "benchmark" / "results").rglob("*.md"))
# "0.93 [0.89, 0.97]", "+53.9 % [+43.7, +69.8]", "3142 [1559, 4726]": a number with its interval
INTERVAL = re.compile(r"[+−-]?\d[\d.]*(?: %)? \[[+−-]?\d[\d.]*, [+−-]?\d[\d.]*\]")


def plain(text):
    """Text as the reports write it: ASCII minus signs, π_T for π<sub>T</sub>."""
    return text.replace("−", "-").replace("π<sub>T</sub>", "π_T")


def test_the_readme_starts_with_three_commands_and_two_answers():
    """The quick start: the CPU wheel, the main job, the tests, adjacent and in the first 50 lines, the test
    command where .ci/run finds it; then the answers to "actors lag?" and "does VACO work?" in the first 60."""
    lines = read(README).splitlines()
    assert len(lines) <= 130, f"README.md has {len(lines)} lines; the rest belongs on the site"
    wheel = next(i for i, line in enumerate(lines) if line.startswith("python3 -m pip install torch --index-url"))
    assert wheel < 50 and "download.pytorch.org/whl/cpu" in lines[wheel]
    assert lines[wheel + 1].startswith("python3 -m pip install -r requirements/mujoco.txt && python3 vaco_continuous.py "
                                       "--env-id Ant-v4 --policy-buffer 8"), lines[wheel + 1]
    assert lines[wheel + 2].startswith("python3 -m pip install -r requirements.txt && python3 -m pytest tests"), \
        lines[wheel + 2]
    ci = next(line for line in read(ROOT / ".ci" / "run").splitlines() if line.startswith("cmd="))
    extracted = subprocess.run(["bash", "-c", ci + '; echo "$cmd"'], cwd=ROOT, capture_output=True, text=True)
    assert extracted.stdout.strip() == lines[wheel + 2].split("  #")[0].strip(), ".ci/run finds another test command"
    for answer in ("**Actors lag?", "**Does VACO work?"):
        at = next((i for i, line in enumerate(lines) if line.startswith(answer)), None)
        assert at is not None and at < 60, f"README.md: {answer}** is not in the first 60 lines"


def report_section(path, name):
    return "\n".join(line for line, _ in file_lines(path, name))


def table_rows(text):
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and not re.fullmatch(r"\|[-|]+\|", line.strip())]


def test_the_readmes_table_is_the_reports():
    """"Under lag, which script" on the README is the ten-task report's table, cell for cell, and its commands, the
    list below the table, line for line."""
    section = report_section(ROOT / "benchmark/results/ten-tasks/report.md", "which_script")
    text = read(README)
    text = text[text.index("### Under lag, which script"):text.index("## The scripts")]
    assert [[plain(cell) for cell in row] for row in table_rows(text)] == \
        [[plain(cell) for cell in row] for row in table_rows(section)], \
        "README.md's table differs from benchmark/results/ten-tasks/report.md:which_script; copy it again"
    # the README's commands run `python3`, as its install lines do; the report's, `python`
    commands = [line for line in section.splitlines() if line.startswith("- ")]
    readme = [plain(line).replace("`python3 ", "`python ") for line in text.splitlines() if line.startswith("- ")]
    assert commands and readme == [plain(line) for line in commands], \
        "README.md's commands differ from benchmark/results/ten-tasks/report.md:which_script; copy them again"


def test_every_interval_on_the_readme_and_the_summary_is_one_a_report_holds():
    """A number with its interval on the README or the summary page is written as a report writes it: a second
    reader finds each in a file a benchmark wrote."""
    reports = "\n".join(plain(read(path)) for path in REPORTS)
    reports = reports.replace("] %", "]")  # "+53.9 % [+43.7, +69.8]" in prose, "+53.9 % [+43.7, +69.8]" in a table
    missing = []
    for path in (README, SUMMARY):
        text = " ".join(line for line in read(path).splitlines() if not INCLUDE.match(line))  # one broken over lines too
        for quoted in INTERVAL.findall(text):
            if plain(quoted) not in reports:
                missing.append(f"{path.relative_to(ROOT)}: {quoted}")
    assert not missing, "intervals no report holds (retyped, or from an old report):\n" + "\n".join(missing)


def test_the_results_pages_stay_short():
    assert len(read(SUMMARY).splitlines()) <= 150, "docs/results.md: the summary is over 150 lines"
    assert len(RESULT_PAGES) >= 10
    for page in RESULT_PAGES:
        n = len(read(page).splitlines())
        assert n <= 400, f"{page.relative_to(ROOT)}: {n} lines, over 400"


def test_links_to_a_section_of_the_old_results_page_land_on_its_page(site):
    """docs/javascripts/old_anchors.js sends results.html#anchor to the page the section moved to: every target
    is a built page with that anchor, and every anchor the summary itself has stays on it."""
    targets = dict(re.findall(r'"([\w-]+)": "([\w/.-]+#[\w-]+)"', read(DOCS / "javascripts" / "old_anchors.js")))
    assert len(targets) >= 30
    summary = read(site / "results.html")
    assert "javascripts/old_anchors.js" in summary
    for anchor, target in targets.items():
        page, _, target_anchor = target.partition("#")
        assert (site / page).is_file(), f"old_anchors.js: {anchor} -> {page}, which is not built"
        assert f'id="{target_anchor}"' in read(site / page), f"old_anchors.js: {target} has no such anchor"
        assert f'id="{anchor}"' not in summary, f"results.html has #{anchor} itself and would send it away"


def test_links_from_the_repository_into_the_docs_resolve(site):
    """README.md, CONTRIBUTING.md and benchmark/README.md link to pages (docs/x.md#anchor), which mkdocs does not
    check: each linked page is built, with the anchor."""
    for path in (README, ROOT / "CONTRIBUTING.md", ROOT / "benchmark" / "README.md"):
        for target in re.findall(r"\]\(((?:\.\./)?docs/[\w/.-]+\.md(?:#[\w-]+)?)\)", read(path)):
            page, _, anchor = target.partition("#")
            built = site / Path(page.replace("../", "")).relative_to("docs").with_suffix(".html")
            assert built.is_file(), f"{path.relative_to(ROOT)}: {target} is not a page"
            assert not anchor or f'id="{anchor}"' in read(built), f"{path.relative_to(ROOT)}: {target}: no such anchor"


def test_the_pages_in_a_browser(site):
    """Every page in headless Chromium at 1366 and 390 px (.ci/check_pages.py): nothing wider than the page, every
    image loaded, every figure's text legible (PNG and SVG), no inline code broken inside a word, no command in a table
    cut off on a laptop's screen."""
    pytest.importorskip("selenium", reason="the browser check needs the selenium package (requirements/dev.txt)")
    if not (shutil.which("chromium") or shutil.which("chromium-browser")) or not shutil.which("chromedriver"):
        pytest.skip("the browser check needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    sys.path.insert(0, str(ROOT / ".ci"))
    import check_pages

    problems, _ = check_pages.check(site)
    assert not problems, "\n".join(" ".join(map(str, p)) for p in problems)
