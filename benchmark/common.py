"""What every folder of benchmark/ shares: where the repository and its results are, one reader of a run's
TensorBoard log, one writer of a CSV of rows, a file written whole or not at all, a run's JSON read back, a run
counted finished when its JSON holds its command or set aside when that command changed, a mean over seeds with its
Student-t interval, a script loaded beside today's (as it is, or as of a commit), and how a figure looks and is saved.

A script of a folder is run as a file (`python benchmark/study/run.py ...`) and imports this module, and its folder's
modules, after one line that puts the repository root on the path:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
    from benchmark.common import read_scalars

A module that no one runs as a file (what a folder's scripts share: study/presets.py, grpo/cpu_task.py, ...) needs
no such line: whatever imports it has put the root on the path. The tests import them the same way (pytest.ini puts the
repository root on the path); nothing under benchmark/ imports tests/.
"""

import csv
import glob
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmark", "results")


def tensorboard_log(run_dir):
    """One run's TensorBoard log, read whole (every scalar event kept): `.Tags()`, `.Scalars(tag)` (events with
    `.step`, `.wall_time`, `.value`, in logging order), `.Tensors(tag)`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    return EventAccumulator(str(run_dir), size_guidance={"scalars": 0}).Reload()


def read_scalars(run_dir, field="value"):
    """{tag: [one field of each event, in logging order]} of every scalar of one run's TensorBoard log: the values
    logged, or with field="step" the steps they were logged at, with field="wall_time" the times."""
    log = tensorboard_log(run_dir)
    return {tag: [getattr(event, field) for event in log.Scalars(tag)] for tag in log.Tags()["scalars"]}


def write_csv(path, rows, columns, digits=5):
    """Rows ({column: value}; a missing column is left empty) as a CSV with `columns` in that order, floats to
    `digits` significant figures. Written to a temporary file first: a CSV that exists is whole."""
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.{digits}g}" if isinstance(v, float) else v) for k, v in row.items()})
    os.replace(path + ".tmp", path)


def write_atomic(path, text):
    """Write `text` to `path` through a temporary file: a file that exists is whole."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def read_json(path):
    """The JSON at `path`, or None where there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def is_finished(name, command, out_dir):
    """True when the run's JSON (out_dir/<name>.json, written last) exists and records the same `command`."""
    meta = read_json(os.path.join(out_dir, name + ".json"))
    return meta is not None and meta["command"] == command


def move_stale(name, out_dir):
    """A finished run whose command changed: keep its files (out_dir/<name>.*) under out_dir/stale/ rather than
    overwrite them."""
    stale = [p for p in glob.glob(os.path.join(out_dir, name + ".*")) if os.path.isfile(p)]
    if stale:
        os.makedirs(os.path.join(out_dir, "stale"), exist_ok=True)
        for p in stale:
            os.replace(p, os.path.join(out_dir, "stale", os.path.basename(p)))
        print(f"note: {name} was run with another command; old results moved to {out_dir}/stale/", flush=True)


def script_at(commit, script, folder):
    """Write the top-level `script` as of `commit` into `folder`; returns its path, or None where git or that commit
    is not at hand. For checks of today's scripts against an earlier commit's: study/same_runs.py,
    speed/update_step.py and speed/rollout_cost.py --against, grpo/memory.py and tests/test_same_results.py."""
    try:
        shown = subprocess.run(["git", "show", f"{commit}:{script}"], cwd=ROOT, capture_output=True, text=True,
                               check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    path = os.path.join(folder, script)
    with open(path, "w") as f:
        f.write(shown.stdout)
    return path


def import_script(path, name):
    """The script at `path` imported as the module `name`: the scripts stand alone, so another version of one
    imports beside today's."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def t_interval(values):
    """Mean and 95% Student-t interval of the mean over seeds (n - 1 degrees of freedom): mean, (low, high), the
    interval (nan, nan) for one seed. The spread of training runs, not the sampling error of each run's score."""
    import numpy as np
    from scipy import stats

    values = np.asarray(values, dtype=float)
    mean = values.mean()
    if len(values) < 2:
        return mean, (np.nan, np.nan)
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return mean, (mean - half, mean + half)


# ---- figures: the size, fonts and colours of every benchmark's figures (study/plotting.py adds the study's own) ----
# Drawn for a phone as much as for a laptop: 6.4 in wide (1280 px at FIGURE_DPI), with text of at least MIN_FONT_PT,
# so that on a phone's 390 px screen, where the figure is 358 px wide, its smallest text is still 10 px high (the
# site shows a figure at most 600 px wide on a laptop, where that text is 17 px).
FIGURE_DPI = 200
FIGURE_WIDTH = 6.4
MIN_FONT_PT = 13.5
FONT = {"font.size": 14, "axes.titlesize": 14, "axes.labelsize": 14, "xtick.labelsize": MIN_FONT_PT,
        "ytick.labelsize": MIN_FONT_PT, "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT,
        "figure.titlesize": 14}
# Okabe & Ito (2008), "Color Universal Design": eight colours that stay distinct under every common colour blindness
OKABE_ITO = {"blue": "#0072B2", "vermillion": "#D55E00", "green": "#009E73", "sky": "#56B4E9", "orange": "#E69F00",
             "purple": "#CC79A7", "yellow": "#F0E442", "black": "#000000"}


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def smallest_font(fig):
    """The size in points of the smallest text the figure shows."""
    import matplotlib.text

    fig.canvas.draw()  # tick labels exist once drawn
    return min(t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip())


def save_figure(fig, path):
    """Write the figure at FIGURE_DPI, with its smallest font and its resolution recorded in the PNG (`min-font-pt`,
    `dpi`): .ci/check_pages.py reads them to check how large that text is on the pages."""
    metadata = {"min-font-pt": f"{smallest_font(fig):g}", "dpi": f"{FIGURE_DPI}"} if path.endswith(".png") else None
    fig.savefig(path, dpi=FIGURE_DPI, metadata=metadata)
    pyplot().close(fig)
