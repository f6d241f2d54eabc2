"""Learning-curve report of finished training runs: a markdown table of final returns and a plot.

Reads the TensorBoard logs under `--runs-dir` (one folder per run, named
`<env>__<exp_name>__<seed>__<time>` by the training scripts), groups runs by env and exp name
(seeds together), and reports the mean episodic return of the last 100 training episodes of each
run, as CleanRL's benchmarks do.

    python benchmark/report.py --runs-dir runs --plot docs/img/learning_curves.png
"""

import collections
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@dataclass
class Args:
    runs_dir: str = "runs"
    """folder holding one TensorBoard folder per run"""
    plot: Optional[str] = None
    """where to save the learning-curve figure (PNG); none if unset"""
    last: int = 100
    """final return = mean over this many last training episodes"""


def episodic_returns(run_dir):
    """(global steps, returns) of every finished training episode of one run."""
    acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("charts/episodic_return") if "charts/episodic_return" in acc.Tags()["scalars"] else []
    return np.array([e.step for e in events]), np.array([e.value for e in events])


def collect(runs_dir):
    """{(env_id, exp_name): [(steps, returns) per seed]}"""
    groups = collections.defaultdict(list)
    for name in sorted(os.listdir(runs_dir)):
        parts = name.split("__")
        if len(parts) != 4:
            continue
        env_id, exp_name, _seed, _time = parts
        steps, returns = episodic_returns(os.path.join(runs_dir, name))
        if len(returns):
            groups[(env_id, exp_name)].append((steps, returns))
    return groups


def table(groups, last):
    lines = [f"| env | run | seeds | steps | final return (mean of last {last} episodes) |", "|-|-|-|-|-|"]
    for (env_id, exp_name), runs in sorted(groups.items()):
        finals = [returns[-last:].mean() for _, returns in runs]
        spread = f" ± {np.std(finals):.0f}" if len(finals) > 1 else ""
        steps = max(int(s[-1]) for s, _ in runs)
        lines.append(f"| {env_id} | {exp_name} | {len(runs)} | {steps:,} | {np.mean(finals):.0f}{spread} |")
    return "\n".join(lines)


def plot(groups, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({env_id for env_id, _ in groups})
    colors = {name: f"C{i % 10}" for i, name in enumerate(sorted({name for _, name in groups}))}
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 3.6), squeeze=False)
    for ax, env_id in zip(axes[0], envs):
        for (env, exp_name), runs in sorted(groups.items()):
            if env != env_id:
                continue
            for i, (steps, returns) in enumerate(runs):
                window = min(100, len(returns))  # moving average over episodes
                smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
                ax.plot(steps[window - 1:], smooth, label=exp_name if i == 0 else None, color=colors[exp_name])
        ax.set_title(env_id)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("episodic return (moving average)")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)


def main(args: Args):
    groups = collect(args.runs_dir)
    if not groups:
        raise SystemExit(f"error: no run with episodic returns under {args.runs_dir}")
    print(table(groups, args.last))
    if args.plot:
        plot(groups, args.plot)
        print(f"plot saved to {args.plot}")


if __name__ == "__main__":
    main(tyro.cli(Args))
