"""How the report writes what a section found: Markdown lines, a section between the snippet markers by which a docs
page includes it (pymdownx.snippets), numbers with their intervals, the rows of the lag won back, and the line for a
block of runs still running.
"""

from benchmark.common import t_interval
from benchmark.study.presets import method
from benchmark.study.scores import finals


def marked(name, lines):
    """Lines between snippet markers, so that a docs page can include them (pymdownx.snippets)."""
    return [f"<!-- --8<-- [start:{name}] -->", *lines, f"<!-- --8<-- [end:{name}] -->", ""] if lines else []


def titled(title, name, lines):
    """A heading, then `lines` between snippet markers: the heading stays outside them, since a page
    that includes the section has its own (a heading inside would repeat in the page's contents)."""
    return [f"### {title}", "", *marked(name, lines)] if lines else []


def per_lag(study, lags, each, title, name):
    """One section for each K of `lags`: `each(study, k)` gives its lines and whether it drew its figure; `title(k)`
    heads it, the snippet markers are <name>_k<K> and the figure <name>_K<K>.png."""
    lines = []
    for k in lags:
        found, drawn = each(study, k)
        lines += titled(title(k), f"{name}_k{k}", found)
        lines += [f"![{title(k)}]({study.figures.link(f'{name}_K{k}.png')})", ""] if drawn else []
    return lines


def fmt_interval(point, interval):
    return f"{point:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def share_rows(tasks, methods, shares):
    """The rows of a table of the share of PPO's lag loss each of `methods` wins back (estimates.lag_won_back's
    `shares` on `tasks`): one a task, then their mean and median in bold."""
    lines = [f"| {task} | " + " | ".join(fmt_interval(shares[a][0][i], shares[a][1][:, i]) for a in methods) + " |"
             for i, task in enumerate(tasks)]
    for j, name in ((-2, "mean"), (-1, "median")):
        lines.append(f"| **{name}** | " + " | ".join(f"**{fmt_interval(shares[a][0][j], shares[a][1][:, j])}**"
                                                      for a in methods) + " |")
    return lines


def seeds_cell(raw, key, tasks):
    """How many seeds (algorithm, K) `key` ran on each of `tasks`: "3", or "3–10" where its tasks have different
    numbers of them."""
    counts = [len(finals(raw, key, t)) for t in tasks]
    return str(min(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"


def seeds_note(raw, keys, tasks):
    """" *Seeds* per task: 5 of PPO at K = 1 and 8 …; 3 of …", to append to the lead of a table whose (algorithm, K)
    `keys` ran different numbers of seeds, so that a table setting 3 seeds beside 5 says so; "" where all ran as many."""
    present = [key for key in keys if any(finals(raw, key, t) for t in tasks)]
    most = {key: max(len(finals(raw, key, t)) for t in tasks) for key in present}
    groups = {}
    for key in sorted(present, key=lambda key: -most[key]):  # the most seeds first; a stable sort keeps the table's order
        groups.setdefault(seeds_cell(raw, key, tasks), {}).setdefault(key[0], []).append(key[1])
    if len(groups) < 2:
        return ""
    named = {count: ", ".join(f"{method(a).name} at K = {' and '.join(map(str, sorted(ks)))}" for a, ks in by.items())
             for count, by in groups.items()}
    return " *Seeds* per task: " + "; ".join(f"{count} of {names}" for count, names in named.items()) + "."


def interval_cell(values):
    """Mean and 95% t-interval of a list of final returns ("" if none; one seed has no interval)."""
    if not values:
        return ""
    mean, (lo, hi) = t_interval(values)
    return f"{mean:.0f} (1 seed)" if len(values) == 1 else f"{mean:.0f} [{lo:.0f}, {hi:.0f}]"


def incomplete_line(partial, k):
    """The line under a table that names the blocks of runs at K = k still running ({algorithm: (runs, planned)})."""
    return [f"Incomplete at K = {k}, in no table here: " + ", ".join(
        f"{method(a).name} ({runs} of {expected} runs)" for a, (runs, expected) in partial.items()) + ".", ""] \
        if partial else []
