"""What the lag-robustness study runs (benchmark/study/run.py) and what its report calls it
(benchmark/study/analyze.py): the methods, one record each (`Method`: its script and the flags it depends on, its name,
colour and marker); the tasks; the presets, each a grid of algorithm x policy lag K x task x seed; the results folder
each preset writes into.

A run of the grid is one training of a top-level script (`Run.command`), written as
benchmark/results/<folder>/<task>__<algorithm>__K<k>__s<seed>.csv / .json.
"""

import itertools
import os
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Optional

from benchmark.common import ROOT

# The last commit whose scripts had ppo_continuous.py's --clip-reference and --max-policy-lag, and --max-update-kl in
# ppo, spo, vaco and geppo_continuous.py: the methods that need them train with its scripts (Method.retired_at)
RETIRED_AT = "56b86c90e88ff4d8938359deccefe5d0c5de75d7"


@dataclass(frozen=True)
class Method:
    """One method of the study, all in one place: what trains it, a top-level script and every flag it depends on (so
    that a change of a script's default cannot silently change what a finished run meant), and how the report shows
    it: its name on the pages, its colour (a name in Okabe and Ito's palette, benchmark/common.py's OKABE_ITO) and
    marker in every figure. Every algorithm of a run needs one: the runner, the report and its figures read nothing
    else, and an algorithm without a record is an error (`method`)."""
    script: str
    flags: tuple[str, ...]
    name: str
    colour: str
    marker: str
    parts: Optional[tuple[str, str]] = None
    """a method under lag: what it is made of, (advantages, trust region), for the trust-region section"""
    sweep_name: Optional[str] = None
    """a variant of the delta sweep: its name beside the sweep's other variants, which take the sweep's palette"""
    retired_at: Optional[str] = None
    """a method whose flags the script has since dropped: the last commit whose script had them. Its finished runs stay,
    and a new run trains with the script as of that commit"""
    earlier: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """earlier spellings (script, flags) of the same training: a run recorded with one of them is this method's run"""

    def spellings(self):
        """(script, flags) of this training: today's first, then the earlier ones."""
        return [(self.script, self.flags), *self.earlier]


# Two methods share a colour only when no figure shows both (the 300k study's baselines and ablations, the ten tasks'
# methods under lag, the remedies).
METHODS = {
    "ppo": Method("ppo_continuous.py", (), "PPO", "blue", "o", parts=("GAE", "PPO's clip on π_θ/β")),
    "ppo-kl": Method("ppo_continuous.py", ("--kl-coef", "0.1"), "PPO-KL", "sky", "^"),
    # decoupled PPO (Hilton et al. 2021): PPO's defaults with the clip centred on pi_T, weighted by pi_T/beta; a flag of
    # ppo_continuous.py before it had a script of its own
    "ppo-decoupled": Method("decoupled_ppo_continuous.py", (), "decoupled PPO", "green", "D",
                            parts=("GAE", "decoupled clip: π_θ/π_T, weight π_T/β"),
                            earlier=(("ppo_continuous.py", ("--clip-reference", "proximal")),)),
    "spo": Method("spo_continuous.py", ("--epsilon", "0.2"), "SPO", "purple", "P"),
    # vaco: the scripts' defaults, which the delta sweep chose (see PRESETS and docs/results/choosing-delta.md)
    "vaco": Method("vaco_continuous.py", ("--tv-threshold", "0.1", "--tv-reference", "behaviour"), "VACO", "vermillion",
                   "s", parts=("V-trace", "TV filter against β")),
    "vaco-noalign": Method("vaco_continuous.py", ("--tv-threshold", "0.1", "--tv-reference", "behaviour",
                                                  "--no-advantage-alignment"), "VACO, no alignment", "orange", "v"),
    "vaco-nofilter": Method("vaco_continuous.py", ("--no-tv-filter",), "VACO, no filter", "green", "D"),
    # both components off: PPO's pipeline with VACO's value loss (no clipping), which separates
    # what the value loss does from what the method does
    "vaco-none": Method("vaco_continuous.py", ("--no-advantage-alignment", "--no-tv-filter", "--no-clip-vloss"),
                        "VACO, neither part", "black", "X"),
    # V-trace's advantages under decoupled PPO's trust region (VACO's ablation with the clip centred on pi_T)
    "vtrace-decoupled": Method("vaco_continuous.py", ("--no-tv-filter", "--clip-reference", "proximal"),
                               "V-trace + decoupled clip", "sky", "^",
                               parts=("V-trace", "decoupled clip: π_θ/π_T, weight π_T/β")),
    # GePPO (Queeney et al. 2021) at the script's defaults: V-trace, the band around pi_T/beta, the learning-rate rule,
    # with the pipeline settings every method shares (not its authors' gamma, lambda, batch and constant rate) and no
    # sample reuse, so eps = 0.2, what the authors' eps = 0.2 x eps_mult gives without reuse (docs/geppo_continuous.md).
    # Its earlier spelling switched the rule on with --adapt-lr, a flag the script no longer has (the rule is on unless
    # its factor is 0).
    "geppo": Method("geppo_continuous.py", ("--clip-coef", "0.2", "--adapt-factor", "0.03"), "GePPO", "purple", "P",
                    parts=("V-trace", "GePPO's band around π_T/β, adaptive actor rate"),
                    earlier=(("geppo_continuous.py", ("--clip-coef", "0.2", "--adapt-lr", "--adapt-factor", "0.03")),)),
    "geppo-gae": Method("geppo_continuous.py", ("--clip-coef", "0.2", "--adapt-factor", "0.03",
                                                "--no-advantage-alignment"), "GePPO with GAE", "black", "X",
                        parts=("GAE", "GePPO's band around π_T/β, adaptive actor rate"),
                        earlier=(("geppo_continuous.py", ("--clip-coef", "0.2", "--adapt-lr", "--adapt-factor", "0.03",
                                                          "--no-advantage-alignment")),)),
    # GePPO with its authors' effective eps: their code runs eps = 0.2 x eps_mult, which their reuse of 4 batches
    # makes 0.1 at their defaults (this script reuses no batch, so eps_mult = 1 and eps = 0.2 above)
    "geppo-clip-0.1": Method("geppo_continuous.py", ("--clip-coef", "0.1", "--adapt-factor", "0.03"), "GePPO, ε = 0.1",
                             "yellow", "p",
                             earlier=(("geppo_continuous.py", ("--clip-coef", "0.1", "--adapt-lr", "--adapt-factor",
                                                               "0.03")),)),
    # Remedies for lag at K = 32, on decoupled PPO: an update that stops once the policy has moved as far from pi_T
    # (exact KL over the batch's states) as a synchronous update moves it on Hopper; and the stale samples left out
    # of the policy loss (those of snapshots 8 or more updates old: K = 8's ages, a quarter of the batch). Both options
    # are gone from the scripts: these run with the scripts as of RETIRED_AT
    "ppo-decoupled-kl-0.015": Method("ppo_continuous.py", ("--clip-reference", "proximal", "--max-update-kl", "0.015"),
                                     "decoupled PPO + KL stop", "orange", "v", retired_at=RETIRED_AT),
    "ppo-decoupled-lag-8": Method("ppo_continuous.py", ("--clip-reference", "proximal", "--max-policy-lag", "8"),
                                  "decoupled PPO, lag under 8", "sky", "P", retired_at=RETIRED_AT),
    # the same KL stop under V-trace's advantages and decoupled PPO's clip, the method that narrows the policy most
    "vtrace-decoupled-kl-0.015": Method("vaco_continuous.py", ("--no-tv-filter", "--clip-reference", "proximal",
                                                               "--max-update-kl", "0.015"),
                                        "V-trace + decoupled clip + KL stop", "purple", "^", retired_at=RETIRED_AT),
}
# The delta sweep: every threshold against each reference policy. Its figure tells the variants apart by colour, in
# this palette, in the order of the variants it shows (plotting.colour); each variant's own colour is its place in
# the whole sweep.
DELTAS = (0.05, 0.1, 0.2)
SWEEP_PALETTE = ("green", "sky", "black", "purple", "orange", "yellow")
for _i, (_reference, _delta) in enumerate(itertools.product(("behaviour", "proximal"), DELTAS)):
    _name = f"VACO, δ = {_delta} against {'β' if _reference == 'behaviour' else 'π_T'}"
    METHODS[f"vaco-{_reference}-{_delta}"] = Method("vaco_continuous.py", ("--tv-threshold", str(_delta),
                                                                           "--tv-reference", _reference),
                                                    _name, SWEEP_PALETTE[_i], "o", sweep_name=_name)
# VACO against pi_T at the default delta is also a method under lag of its own, beside decoupled PPO on the ten tasks
METHODS["vaco-proximal-0.1"] = replace(METHODS["vaco-proximal-0.1"], name="VACO against π_T", colour="orange",
                                       marker="v", parts=("V-trace", "TV filter against π_T"))
BEHAVIOUR_SWEEP = [f"vaco-behaviour-{d}" for d in DELTAS]
# At K = 1 pi_T = beta, so a proximal variant is its behaviour twin, run for run (a test checks it):
# the sweep runs the proximal ones at K > 1 only.
PROXIMAL_SWEEP = [f"vaco-proximal-{d}" for d in DELTAS]
SWEEP = BEHAVIOUR_SWEEP + PROXIMAL_SWEEP


def method(algorithm):
    """The record of one of the study's algorithms; an error that says so for an algorithm without one."""
    if algorithm not in METHODS:
        raise LookupError(f"no record of the method '{algorithm}' in benchmark/study/presets.py's METHODS "
                          "(CONTRIBUTING.md, 'Add a question to the study')")
    return METHODS[algorithm]


TUNING_TASKS = ["Hopper-v4", "HalfCheetah-v4"]  # delta is chosen on these only
HELD_OUT_TASKS = ["Walker2d-v4", "Ant-v4"]  # ... and reported on these
# The paper's ten tasks. Pusher-v4 runs only on mujoco < 3 (gymnasium raises ImportError on mujoco >= 3);
# Pusher-v5 is the same task with fixed model files for mujoco >= 3, so it stands in for it.
PAPER_TASKS = ["Ant-v4", "HalfCheetah-v4", "Hopper-v4", "Humanoid-v4", "HumanoidStandup-v4",
               "InvertedDoublePendulum-v4", "Pusher-v5", "Reacher-v4", "Swimmer-v4", "Walker2d-v4"]
BASELINES = ["ppo-kl", "spo", "vaco-noalign", "vaco-nofilter", "vaco-none"]
# The ten tasks by the mean wall time of their first three seeds' runs (Reacher-v4 about 6 minutes, Humanoid-v4 29)
CHEAPEST_FIRST = ["Reacher-v4", "Swimmer-v4", "HalfCheetah-v4", "Pusher-v5", "Walker2d-v4", "InvertedDoublePendulum-v4",
                  "Hopper-v4", "Ant-v4", "HumanoidStandup-v4", "Humanoid-v4"]
LAG_TASKS = ["Ant-v4", "HalfCheetah-v4", "Hopper-v4", "Walker2d-v4"]  # where lag hurts PPO at K = 8, run at K = 32

# preset -> (env steps per run, seeds, [(algorithms, policy lags K, tasks), ...]); runs are taken
# in this order, so the first block's results arrive first.
PRESETS = {
    "cpu": (300_000, [1, 2, 3], [
        (["ppo"] + BEHAVIOUR_SWEEP, [1, 8], TUNING_TASKS),
        (PROXIMAL_SWEEP, [8], TUNING_TASKS),
        (["ppo", "vaco"], [1, 2, 4, 8], TUNING_TASKS + ["Walker2d-v4"]),
        (BASELINES, [1, 8], TUNING_TASKS + ["Walker2d-v4"]),
    ]),
    # The finalists of the cpu sweep at the full budget, then the chosen default on held-out tasks.
    # Rule, fixed before the sweep finished: rank by the mean over K in {1, 8} of the IQM of the
    # normalised final score on the tuning tasks; the top two (behaviour 0.2: 0.91, proximal 0.1:
    # 0.89) go on, with behaviour 0.1 (0.855), whose K = 1 runs are proximal 0.1's anyway.
    "cpu-1m": (1_000_000, [1, 2, 3], [
        (["ppo", "vaco-behaviour-0.2", "vaco-behaviour-0.1"], [1, 8], TUNING_TASKS),
        (["vaco-proximal-0.1"], [8], TUNING_TASKS),
        (["ppo", "vaco"], [1, 8], HELD_OUT_TASKS),
    ]),
    # The paper's breadth at what 2 cores can finish: PPO and VACO at their defaults (nothing tuned on
    # these tasks), without lag and at K = 8, all ten tasks, 3 seeds; then decoupled PPO, the standard
    # remedy for stale data in PPO, at K = 8 (at K = 1 it is PPO, run for run: a test checks it).
    "ten-tasks": (1_000_000, [1, 2, 3], [(["ppo", "vaco"], [1, 8], PAPER_TASKS),
                                         (["ppo-decoupled"], [8], PAPER_TASKS)]),
    # Beside decoupled PPO, which centres PPO's clip on pi_T: VACO with its TV filter measured against
    # pi_T instead of beta (--tv-reference proximal, delta 0.1), at K = 8 on the same grid and folder.
    "ten-tasks-proximal": (1_000_000, [1, 2, 3], [(["vaco-proximal-0.1"], [8], PAPER_TASKS)]),
    # Which part wins lag back: V-trace's advantages under decoupled PPO's clip, and GePPO (V-trace with a TV band
    # around pi_T), at K = 8 on the same grid and folder; then GePPO with GAE, the advantages under a second trust
    # region.
    "ten-tasks-trust-region": (1_000_000, [1, 2, 3], [(["vtrace-decoupled", "geppo"], [8], PAPER_TASKS),
                                                      (["geppo-gae"], [8], PAPER_TASKS)]),
    # How much lag is too much: K = 32 (snapshots 0-31 updates old, 15.5 on average) on four of the tasks where lag
    # hurts PPO at K = 8, every method at its K = 8 settings (nothing tuned for K = 32): PPO, VACO, decoupled PPO,
    # and V-trace with the decoupled clip, the trust-region study's highest median share of the lag won back at K = 8.
    "ten-tasks-k32": (1_000_000, [1, 2, 3], [(["ppo", "vaco", "ppo-decoupled", "vtrace-decoupled"], [32], LAG_TASKS)]),
    # How much GePPO's eps moves its result: eps = 0.1 (what its authors' sample reuse makes of their 0.2) at K = 8,
    # seed 1 of the ten tasks, beside the eps = 0.2 runs
    "ten-tasks-geppo-eps": (1_000_000, [1], [(["geppo-clip-0.1"], [8], PAPER_TASKS)]),
    # Remedies at K = 32 on the same four tasks, 3 seeds: decoupled PPO with the KL stop, and GePPO with GAE (its band
    # around pi_T/beta and its adaptive actor rate, on decoupled PPO's advantages)
    "ten-tasks-k32-remedies": (1_000_000, [1, 2, 3], [(["ppo-decoupled-kl-0.015", "geppo-gae"], [32], LAG_TASKS)]),
    # Two more, screened on seed 1 beside them: decoupled PPO without its stale samples, and V-trace's advantages with
    # the KL stop
    "ten-tasks-k32-screen": (1_000_000, [1], [(["ppo-decoupled-lag-8", "vtrace-decoupled-kl-0.015"], [32], LAG_TASKS)]),
    # The remedy with the most tasks at 0.75 or more at K = 32 and the policy's entropy in synchronous PPO's range, the KL
    # stop, at K = 8 on the ten tasks (does it trade away what decoupled PPO keeps where lag hurts less?) and at K = 1 on
    # the four tasks (it changes synchronous training too, so what it wins back is also measured against itself at K = 1)
    "ten-tasks-kl-stop": (1_000_000, [1, 2, 3], [(["ppo-decoupled-kl-0.015"], [8], PAPER_TASKS),
                                                 (["ppo-decoupled-kl-0.015"], [1], LAG_TASKS)]),
    # The paper's number of seeds for the comparison every answer rests on: seeds 4 to 10 of synchronous PPO, and of
    # PPO, VACO and decoupled PPO at K = 8, on the ten tasks, the cheapest tasks first. Run seeds 4 and 5 first
    # (--seeds 4 5: 80 runs), then the rest.
    "ten-tasks-ten-seeds": (1_000_000, [4, 5, 6, 7, 8, 9, 10], [(["ppo"], [1], CHEAPEST_FIRST),
                                                                (["ppo", "vaco", "ppo-decoupled"], [8], CHEAPEST_FIRST)]),
    # The README's main job at length: Ant-v4 at K = 8 for 3M steps.
    "ant-3m": (3_000_000, [1, 2, 3], [(["ppo", "vaco"], [8], ["Ant-v4"])]),
    "paper": (1_000_000, list(range(1, 11)), [
        (["ppo", "vaco"] + BASELINES, [1, 2, 4, 8], PAPER_TASKS),
    ]),
}

# Presets that add runs to another preset's folder, whose report reads them together
FOLDERS = {"ten-tasks-proximal": "ten-tasks", "ten-tasks-trust-region": "ten-tasks", "ten-tasks-k32": "ten-tasks",
           "ten-tasks-geppo-eps": "ten-tasks", "ten-tasks-k32-remedies": "ten-tasks", "ten-tasks-k32-screen": "ten-tasks",
           "ten-tasks-kl-stop": "ten-tasks", "ten-tasks-ten-seeds": "ten-tasks"}

# Presets that add seeds to blocks another preset has run: each of their seeds enters the report once its runs are in
# on every task of its block (analyze.py), so that a sitting's partial seed never moves a number
MORE_SEEDS = {"ten-tasks-ten-seeds"}

# How the report groups and orders the methods (their names: METHODS). The algorithms of its aggregates, in the order of
# its tables and figures; the methods under lag that it sets beside PPO (the lag they win back, the trust region, a
# larger lag); what was tried to win back more of the lag at K = 32, which the remedies section sets beside decoupled
# PPO, the method they change.
MAIN_ALGORITHMS = ["ppo", "ppo-kl", "spo", "vaco", "vaco-noalign", "vaco-nofilter", "vaco-none", "ppo-decoupled"]
LAG_METHODS = ["vaco", "vaco-proximal-0.1", "ppo-decoupled", "vtrace-decoupled", "geppo", "geppo-gae"]
REMEDIES = ["ppo-decoupled-kl-0.015", "geppo-gae", "ppo-decoupled-lag-8", "vtrace-decoupled-kl-0.015"]


@dataclass(frozen=True)
class Run:
    task: str
    algorithm: str
    k: int
    seed: int
    steps: int

    @property
    def name(self):
        return f"{self.task}__{self.algorithm}__K{self.k}__s{self.seed}"

    def arguments(self, flags):
        """The script's arguments: the run's place in the grid, its name (--exp-name), then the method's `flags`."""
        return ["--env-id", self.task, "--policy-buffer", str(self.k), "--seed", str(self.seed),
                "--total-timesteps", str(self.steps), "--exp-name", self.algorithm, *flags]

    def command(self, script=None):
        """The command that trains the run: its method's script with the run's arguments; `script`, a path, where
        another copy of the script trains it (a retired method's, as of its commit)."""
        m = method(self.algorithm)
        return [sys.executable, script or os.path.join(ROOT, m.script), *self.arguments(m.flags)]

    def portable_commands(self):
        """The command as a user would type it at the repository root, then the same run in the method's earlier
        spellings: a finished run whose JSON records any of them is this run."""
        return [shlex.join(["python", script, *self.arguments(flags)])
                for script, flags in method(self.algorithm).spellings()]

    def portable_command(self):
        """The command as a user would type it at the repository root: what the run's JSON records."""
        return self.portable_commands()[0]

    def listed_command(self):
        """What a user runs at the repository root to train the run: its portable command, or for a retired method
        the same with the script as of its commit, which git writes into a temporary folder first."""
        m = method(self.algorithm)
        if not m.retired_at:
            return self.portable_command()
        return (f'folder=$(mktemp -d) && git show {m.retired_at}:{m.script} > "$folder/{m.script}" && '
                f'python "$folder/{m.script}" {shlex.join(self.arguments(m.flags))}')


def training_command(command):
    """A run's command without its --exp-name, which names the logs and changes nothing else: two
    runs with the same training command train identically (same script, flags and seed)."""
    words = shlex.split(command)
    i = words.index("--exp-name")
    return shlex.join(words[:i] + words[i + 2 :])


def grid(preset, steps=None):
    """The preset's runs, in order, without duplicates."""
    preset_steps, seeds, blocks = PRESETS[preset]
    steps = steps or preset_steps
    runs = []
    for algorithms, ks, tasks in blocks:
        for seed in seeds:
            for task in tasks:
                for k in ks:
                    runs += [Run(task, a, k, seed, steps) for a in algorithms]
    return list(dict.fromkeys(runs))


def planned_runs(results_dir, presets=PRESETS):
    """{(task, algorithm, k, seed)} that the presets writing into this folder plan (empty for a folder no preset
    writes: then a block counts as finished with synchronous PPO's number of seeds on every task); of `presets` only,
    e.g. MORE_SEEDS."""
    name = os.path.basename(os.path.abspath(results_dir))
    return {(r.task, r.algorithm, r.k, r.seed) for preset in presets if FOLDERS.get(preset, preset) == name
            for r in grid(preset)}
