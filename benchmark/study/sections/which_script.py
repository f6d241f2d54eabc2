"""Under lag, which script: every method under lag beside PPO, one statistic a cell, in the order of the
recommendation: the IQM of its normalised final score at the grid's largest lag on every task, the median share of
PPO's lag loss it wins back where lag hurts PPO, on how many tasks it is clearly behind PPO, and where a larger lag ran
on fewer tasks its IQM there. Below the table, in the same order, the command that runs each under the grid's largest
lag, a line each: what tells the rows apart stays in view on a laptop and a phone, outside the table's columns.
Ordered by the IQM at the grid's largest K (then at the larger K), PPO last, for reference."""

import ast
import os
from functools import lru_cache

import numpy as np

from benchmark.common import ROOT
from benchmark.study.estimates import aggregates, lag_won_back
from benchmark.study.presets import LAG_METHODS, method
from benchmark.study.report import fmt_interval, incomplete_line, seeds_cell, titled
from benchmark.study.scores import completeness, finals, lag_hurt_tasks, pairs_won, score_matrix
from benchmark.study.sections.trust_region import CLEARLY_BEHIND, most_won_when_behind


@lru_cache(maxsize=None)
def script_defaults(script):
    """{--flag: default} of a script's Args, read from its source (literal defaults only)."""
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    args = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args")
    defaults = {}
    for node in args.body:
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            try:
                defaults["--" + node.target.id.replace("_", "-")] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return defaults


def command(algorithm, k):
    """`python script.py --policy-buffer K` and the algorithm's flags that differ from the script's defaults."""
    script, flags = method(algorithm).script, method(algorithm).flags
    defaults, kept, i = script_defaults(script), [], 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        i += 1 if value is None else 2
        if value is None:  # a switch: --x is x = True, --no-x is x = False
            name, on = (flag.replace("--no-", "--", 1), False) if flag.startswith("--no-") else (flag, True)
            if defaults.get(name) is not on:
                kept.append(flag)
        elif str(defaults.get(flag)) != value and defaults.get(flag) != _number(value):
            kept += [flag, value]
    return " ".join(["python", script, "--policy-buffer", str(k), *kept])


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def answers(study):
    """What the table says, computed once (what_moved.py asks it of the first seeds too): {"k", "tasks", "hurt",
    "larger", "scan_tasks", "partial", "scan_partial", "order", "cells"}, the cells {algorithm: {"iqm", "scan",
    "behind", "share"}} of PPO and each method under lag, the order of the rows; or the line that says why there is no
    table."""
    if not study.has_vaco:
        return "no run of VACO"
    raw, normalised, tasks, k, reps, seed = study.raw, study.normalised, study.compared, max(study.ks), study.reps, study.seed
    if not all(finals(raw, ("ppo", kk), t) for kk in (1, k) for t in tasks):
        return f"PPO did not run at K = 1 and {k} on every task"
    methods, partial = completeness(raw, LAG_METHODS, k, tasks, study.planned)
    larger = max((kk for _, kk in study.keys if kk > k and ("ppo", kk) in raw), default=None)
    scan_tasks = sorted(raw.get(("ppo", larger), {})) if larger else []
    scan_methods, scan_partial = completeness(raw, LAG_METHODS, larger, scan_tasks, study.planned) if larger else ([], {})
    if len(methods) < 2:
        return f"fewer than two methods under lag with all their runs in at K = {k}: nothing to choose between"
    rows = [a for a in LAG_METHODS if a in methods or a in scan_methods]
    iqm = lambda key, among: aggregates({"x": score_matrix(normalised, key, among, "final")}, reps, seed)  # noqa: E731
    hurt = lag_hurt_tasks(raw, study.randoms, tasks, k)
    shares = lag_won_back(raw, hurt, k, methods, reps, seed) if hurt else {}
    cells = {}
    for a in ["ppo", *rows]:
        here, there = (a in methods or a == "ppo"), (a in scan_methods or a == "ppo") and larger
        cells[a] = {"iqm": iqm((a, k), tasks) if here else None,
                    "seeds": seeds_cell(raw, (a, k), tasks) if here else "",
                    "scan": iqm((a, larger), scan_tasks) if there and all(finals(raw, (a, larger), t) for t in scan_tasks)
                    else None, "share": shares.get(a)}
        if here and a != "ppo":
            won = [(pairs_won(finals(raw, (a, k), t), finals(raw, ("ppo", k), t)),
                    len(finals(raw, (a, k), t)) * len(finals(raw, ("ppo", k), t))) for t in tasks]
            cells[a]["behind"] = sum(w <= CLEARLY_BEHIND * n for w, n in won)
            cells[a]["pairings"] = [n for _, n in won]

    def point(entry):
        return entry[0]["x"][1] if entry else -np.inf

    order = sorted(rows, key=lambda a: (-point(cells[a]["iqm"]), -point(cells[a]["scan"]))) + ["ppo"]
    return dict(k=k, tasks=tasks, hurt=hurt, larger=larger, scan_tasks=scan_tasks, partial=partial,
                scan_partial=scan_partial, order=order, cells=cells)


def iqm_cell(entry):
    """The IQM of an aggregates entry with its interval, or "" for none."""
    return fmt_interval(entry[0]["x"][1], entry[1]["x"][:, 1]) if entry else ""


def share_cell(share):
    """The median share of the lag won back with its interval (estimates.lag_won_back's entry), or "" for none."""
    return fmt_interval(share[0][-1], share[1][:, -1]) if share else ""


def section(study):
    found = answers(study)
    if isinstance(found, str):
        return found
    k, tasks, hurt, larger, scan_tasks, cells = (found[key] for key in ("k", "tasks", "hurt", "larger", "scan_tasks",
                                                                        "cells"))
    scan_head = f" IQM at K = {larger}, {len(scan_tasks)} tasks |" if larger else ""
    lines = [f"Methods under lag at K = {k}, {len(tasks)} tasks, ordered by their IQM there, PPO last for reference. "
             "*IQM*: the interquartile mean (the mean of the middle half) over tasks × seeds of the normalised final "
             "score, 0 = a random policy and 1 = synchronous PPO's mean on the task (PPO at K = 1). *Lag won back*: "
             f"the median, over the {len(hurt)} tasks where lag hurts PPO at K = {k}, of the share of PPO's loss that "
             f"the method wins back. *Clearly behind PPO*: the tasks where PPO at K = {k} wins at least "
             f"{1 - CLEARLY_BEHIND:.0%} of the pairings of seeds ("
             f"{most_won_when_behind((n for c in cells.values() for n in c.get('pairings', [])), lost=True)}). 95% "
             "stratified-bootstrap intervals" + (f"; K = {larger} ran on {', '.join(scan_tasks)}." if larger else ".")
             + f" *Seeds*: how many each task ran at K = {k}; the pairings and intervals use every seed a method has.",
             "", f"| method | seeds | IQM at K = {k} | lag won back | clearly behind PPO |" + scan_head,
             "|-|-|-|-|-|" + ("-|" if larger else "")]
    for a in found["order"]:
        c = cells[a]
        row = [method(a).name, c["seeds"], iqm_cell(c["iqm"]), share_cell(c["share"]) or ("0 (reference)" if a == "ppo" else ""),
               f"{c['behind']} of {len(tasks)} tasks" if "behind" in c else ""]
        if larger:
            row.append(iqm_cell(c["scan"]))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"The command of each, at K = {k} (add `--env-id TASK`):", ""]
    lines += [f"- {method(a).name}: `{command(a, k)}`" for a in found["order"]]
    lines += [""] + incomplete_line(found["partial"], k) + (incomplete_line(found["scan_partial"], larger)
                                                            if larger else [])
    return titled("Under lag, which script", "which_script", lines)
