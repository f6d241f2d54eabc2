"""Learning curves of one MuJoCo script, for its page: episode return against env steps at K = 1 and
K = 8 on every task a study ran the script on at its defaults, mean over seeds (line) ± one standard
deviation over seeds (band), one panel per task and K, two panels a row.

    python benchmark/study/script_curves.py ppo_continuous.py benchmark/results/cpu-1m
    python benchmark/study/script_curves.py vaco_continuous.py benchmark/results/cpu-1m --reference ppo_continuous.py
    python benchmark/study/script_curves.py spo_continuous.py benchmark/results/cpu --reference ppo_continuous.py

Each writes docs/img/curves/<script>.png (`--out` to change it) and prints which runs it drew.

Which runs: those whose command (the JSON beside each run's CSV) runs the script with every flag at
the script's default except the task, the lag K, the seed, the step budget and the run's name. The
flags are parsed with the script's own `Args`, so a study's names do not matter: the study calls
VACO at its defaults `vaco` on some tasks and `vaco-behaviour-0.1` on others, and both are drawn as
one curve, labelled with the study's name for the script's defaults (`ppo`, `vaco`, `spo`). Runs
that trained identically (the same command but for `--exp-name`) count once.

The drawing is the study report's (`plotting.curves_figure`): the return of the episodes that ended in
each 2 % of a run's env steps (`slice_scores`), in the colours of the study's figures.
"""

import contextlib
import dataclasses
import importlib
import io
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT  # noqa: E402
from benchmark.study.plotting import curves_figure  # noqa: E402
from benchmark.study.analyze import seeds_still_running  # noqa: E402
from benchmark.study.presets import METHODS, MORE_SEEDS, planned_runs, training_command  # noqa: E402
from benchmark.study.scores import load_runs  # noqa: E402

# the study's name for each script at its defaults; the report draws and colours them by these names
LABELS = {"ppo_continuous.py": "ppo", "vaco_continuous.py": "vaco", "spo_continuous.py": "spo",
          "geppo_continuous.py": "geppo", "decoupled_ppo_continuous.py": "ppo-decoupled"}
# flags a study sets per run without changing the method
PER_RUN_FLAGS = ("--env-id", "--policy-buffer", "--seed", "--total-timesteps", "--exp-name")


@dataclass
class Args:
    script: tyro.conf.Positional[str]
    """the script whose curves are drawn: ppo_continuous.py, vaco_continuous.py, spo_continuous.py,
    geppo_continuous.py or decoupled_ppo_continuous.py"""
    results_dir: tyro.conf.Positional[str]
    """a folder of study results (CSV + JSON per run), e.g. benchmark/results/cpu-1m"""
    reference: Optional[str] = None
    """another script drawn beside it at its defaults, from the same folder (e.g. ppo_continuous.py)"""
    ks: list[int] = field(default_factory=lambda: [1, 8])
    """the policy lags K drawn, one panel each per task"""
    out: Optional[str] = None
    """the PNG written (default: docs/img/curves/<script without .py>.png)"""


def script_defaults(script):
    """(the script imported as a module, {field: value} of its Args at their defaults)."""
    module = importlib.import_module(script[: -len(".py")])
    return module, dataclasses.asdict(module.Args())


def todays_spelling(script, flags):
    """(script, flags) of a run as today's scripts spell it: a study method's earlier spelling (a flag a script has
    since dropped, a method since given a script of its own; presets.Method.earlier) becomes its current one."""
    for m in METHODS.values():
        if (script, tuple(flags)) in m.earlier:
            return m.script, list(m.flags)
    return script, flags


def runs_at_defaults(runs, script):
    """The runs whose command is `script` with every flag at its default but PER_RUN_FLAGS, each once
    (a run with the training command of an earlier one is left out). Returns (runs, {study name: tasks})."""
    module, defaults = script_defaults(script)
    chosen, seen, names = [], set(), {}
    for meta, rows in runs:
        words = shlex.split(meta.get("command", ""))
        if len(words) < 2:
            continue
        flags, i = [], 2
        while i < len(words):
            if words[i] in PER_RUN_FLAGS:
                i += 2
            else:
                flags.append(words[i])
                i += 1
        recorded, flags = todays_spelling(os.path.basename(words[1]), flags)
        if recorded != script:
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                parsed = dataclasses.asdict(tyro.cli(module.Args, args=flags))
        except SystemExit:  # a flag the script does not have (a retired method's): not its defaults, and no error box
            continue
        if any(parsed[key] != value for key, value in defaults.items()
               if "--" + key.replace("_", "-") not in PER_RUN_FLAGS):
            continue
        training = training_command(meta["command"])
        if training in seen:
            continue
        seen.add(training)
        names.setdefault(meta["algorithm"], set()).add(meta["task"])
        chosen.append(({**meta, "algorithm": LABELS[script]}, rows))
    return chosen, names


def summary(runs, label):
    """"Ant-v4 K=1: 3 seeds x 1000000 steps; ..." of the runs drawn as `label`."""
    cells = {}
    for meta, _ in runs:
        if meta["algorithm"] == label:
            cells.setdefault((meta["task"], meta["k"]), []).append(meta["total_timesteps"])
    return "; ".join(f"{task} K={k}: {len(steps)} seeds x {'/'.join(str(s) for s in sorted(set(steps)))} steps"
                     for (task, k), steps in sorted(cells.items()))


def main(args: Args):
    scripts = [args.script] + ([args.reference] if args.reference else [])
    unknown = [s for s in scripts if s not in LABELS]
    if unknown:
        sys.exit(f"error: {unknown[0]} is not one of {', '.join(LABELS)}")
    if args.reference == args.script:
        sys.exit("error: --reference is the script itself")
    if not os.path.isdir(args.results_dir):
        sys.exit(f"error: {args.results_dir} is not a folder")
    runs = load_runs(args.results_dir)
    # a seed that a preset adds to a study's blocks is drawn once it is in on every task, as the report counts it
    running = seeds_still_running(runs, planned_runs(args.results_dir, MORE_SEEDS))
    runs = [(meta, rows) for meta, rows in runs
            if meta.get("k") in args.ks and (meta["algorithm"], meta["k"], meta["seed"]) not in running]
    drawn = []
    for script in scripts:
        chosen, names = runs_at_defaults(runs, script)
        if not chosen:
            sys.exit(f"error: no finished run of {script} at its defaults at K in {args.ks} in {args.results_dir}")
        drawn += chosen
        print(f"{script} at its defaults, drawn as {LABELS[script]!r}: "
              + "; ".join(f"study name {name!r} on {', '.join(sorted(tasks))}" for name, tasks in sorted(names.items())))
        print(f"  {summary(chosen, LABELS[script])}")
    keys = {}
    for meta, _ in drawn:
        keys.setdefault((meta["algorithm"], meta["k"]), set()).add(meta["task"])
    out = args.out or os.path.join(ROOT, "docs", "img", "curves", args.script[: -len(".py")] + ".png")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    curves_figure(drawn, keys, sorted(args.ks), (), out, shown={LABELS[s] for s in scripts})
    print(f"figure: {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
