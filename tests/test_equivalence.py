"""The scripts differ only where they say they do. Each comparison trains two scripts (or two
settings) with the same seed and checks that they agree exactly where they claim to, and that the
comparison would see a difference (so it can fail)."""

import ast
import difflib
import os
import re
import sys

import numpy as np
import pytest
import torch

import decoupled_ppo_continuous as decoupled
import ppo_continuous as ppo
import spo_continuous as spo
import vaco_continuous as vaco
from conftest import ROOT

# a few updates with lag and large steps, so that stale snapshots, V-trace's ratios and PPO's clip all act
FEW_UPDATES = dict(total_timesteps=512, policy_buffer=4, learning_rate=3e-3)
# what every script logs: the rollout (episodes, lag) and the update (losses)
SHARED = ["charts/episodic_return", "charts/episodic_length", "charts/policy_lag_mean", "charts/backward_tv",
          "losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
          "losses/tv_divergence", "losses/explained_variance"]


def assert_same_run(a, b):
    for tag in SHARED:
        assert len(a[tag]) > 0 and a[tag] == b[tag], tag


def test_vaco_without_its_method_is_ppo(train):
    # both components off and PPO's value-loss clipping: PPO, bit for bit
    _, reference = train(ppo, exp_name="ppo", **FEW_UPDATES)
    _, none = train(vaco, exp_name="none", advantage_alignment=False, tv_filter=False, clip_vloss=True, **FEW_UPDATES)
    assert_same_run(reference, none)
    assert max(reference["losses/clipfrac"]) > 0 and max(reference["charts/backward_tv"]) > 0  # clip and lag acted
    # VACO's own value loss (no clipping) is the one difference left; the comparison sees it
    _, unclipped = train(vaco, exp_name="unclipped", advantage_alignment=False, tv_filter=False, **FEW_UPDATES)
    assert unclipped["losses/value_loss"] != reference["losses/value_loss"]


def test_vtrace_with_the_decoupled_clip_is_decoupled_ppo_but_for_its_advantages(train):
    # VACO's ablation with decoupled PPO's clip: without V-trace, and with PPO's value-loss clipping, it is
    # decoupled PPO bit for bit; with V-trace (the option's purpose) the same trust region on other advantages
    _, reference = train(decoupled, exp_name="decoupled", **FEW_UPDATES)
    common = dict(tv_filter=False, clip_reference="proximal", clip_vloss=True, **FEW_UPDATES)
    _, gae = train(vaco, exp_name="gae", advantage_alignment=False, **common)
    _, vtrace = train(vaco, exp_name="vtrace", **common)
    assert_same_run(reference, gae)
    assert max(reference["losses/clipfrac"]) > 0
    assert vtrace["losses/policy_loss"][1:] != reference["losses/policy_loss"][1:]
    assert vtrace["charts/episodic_return"][:3] == reference["charts/episodic_return"][:3]  # the same first rollout


def test_each_vaco_component_changes_the_run(train):
    _, none = train(vaco, exp_name="none", advantage_alignment=False, tv_filter=False, **FEW_UPDATES)
    _, align = train(vaco, exp_name="align", tv_filter=False, **FEW_UPDATES)
    _, filtered = train(vaco, exp_name="filter", advantage_alignment=False, tv_threshold=0.01, **FEW_UPDATES)
    # the rollout of the first update is the same in all three: the components act only on learning
    assert none["charts/episodic_return"][0] == align["charts/episodic_return"][0] == filtered["charts/episodic_return"][0]
    assert align["losses/value_loss"] != none["losses/value_loss"]  # V-trace targets differ from GAE's under lag
    assert max(filtered["losses/filtered_fraction"]) > 0
    assert filtered["losses/policy_loss"] != none["losses/policy_loss"]


def test_spo_is_ppo_but_for_the_policy_loss(train, monkeypatch):
    # with PPO's clipped surrogate in place of SPO's objective, the SPO script trains exactly as PPO
    _, reference = train(ppo, exp_name="ppo", **FEW_UPDATES)
    spo_policy_loss = spo.spo_policy_loss
    monkeypatch.setattr(spo, "spo_policy_loss", lambda newlogprob, behaviour_logprobs, advantages, epsilon:
                        ppo.ppo_policy_loss(newlogprob, behaviour_logprobs, advantages, epsilon))
    _, swapped = train(spo, exp_name="swapped", **FEW_UPDATES)
    assert_same_run(reference, swapped)
    monkeypatch.setattr(spo, "spo_policy_loss", spo_policy_loss)  # not undo(): that would leave the run's folder too
    _, own = train(spo, exp_name="spo", **FEW_UPDATES)
    assert own["losses/policy_loss"] != reference["losses/policy_loss"]


def test_spo_and_ppo_agree_where_both_ratios_are_one(train):
    # One epoch of one minibatch at K = 1: every update is a single step from r = 1, where SPO's
    # gradient, (A - |A| (r - 1) / eps) dr, equals PPO's, A dr. r is 1 only up to float rounding (the
    # actors' forward pass runs on the envs, the learner's on the whole batch), so within a tolerance.
    settings = dict(total_timesteps=512, num_minibatches=1, update_epochs=1)
    _, a = train(ppo, exp_name="ppo", **settings)
    _, b = train(spo, exp_name="spo", **settings)
    for tag in ["charts/episodic_return", "losses/policy_loss", "losses/value_loss", "losses/entropy"]:
        np.testing.assert_allclose(a[tag], b[tag], rtol=1e-4, atol=1e-6, err_msg=tag)
    # several minibatches: ratios leave 1 and the two objectives part
    _, c = train(ppo, exp_name="ppo4", total_timesteps=512)
    _, d = train(spo, exp_name="spo4", total_timesteps=512)
    assert not np.allclose(c["losses/policy_loss"], d["losses/policy_loss"], rtol=1e-3)


@pytest.mark.parametrize("ratio", [1.0, 1.1, 0.9])
def test_spo_and_ppo_policy_losses_near_one(ratio):
    # inside the trust region both objectives equal r A at r = 1, with the same gradient; away
    # from 1 SPO's penalty |A| (r - 1)^2 / (2 eps) is the only difference
    advantages = torch.tensor([1.5, -0.5])
    grads = []
    for loss_fn in (ppo.ppo_policy_loss, spo.spo_policy_loss):
        newlogprob = torch.full((2,), float(np.log(ratio)), requires_grad=True)
        loss, _ = loss_fn(newlogprob, torch.zeros(2), advantages, 0.2)
        loss.backward()
        grads.append((loss.item(), newlogprob.grad.clone()))
    (ppo_loss, ppo_grad), (spo_loss, spo_grad) = grads
    penalty = (advantages.abs() * (ratio - 1) ** 2 / 0.4).mean().item()
    assert spo_loss == pytest.approx(ppo_loss + penalty, abs=1e-7)
    if ratio == 1.0:
        torch.testing.assert_close(spo_grad, ppo_grad, rtol=0, atol=0)


# What each sibling's diff may show: for a pair (base, sibling), the regions of the files a changed line may lie in
# (the module's header, its imports, an option of Args as `Args.<field>`, a top-level function or class) and, for
# the shared functions where a method changes a few lines, the patterns each of those lines must match. True: the
# region may change as a whole (the method itself, or a function only one side has). Any other hunk fails.
POLICY_LOSS = r"policy_loss|# Policy loss|mb_advantages, args\.clip_coef\)|clip_ratio"
PPO_KL = r"kl_coef|# PPO-KL"  # PPO's own option: a sibling may delete it
RANGES = r'seed="\[0, 4294967295\]"'  # check_args's line of intervals where each script's own options begin
SIBLINGS = {
    ("ppo_continuous.py", "spo_continuous.py"): {
        "header": True, "Args.epsilon": True, "Args.clip_coef": True, "Args.kl_coef": True,
        "ppo_policy_loss": True, "spo_policy_loss": True,
        "minibatch_loss": [POLICY_LOSS, PPO_KL, r"clipfrac="], "check_args": [RANGES, PPO_KL + r"|epsilon"]},
    ("ppo_continuous.py", "decoupled_ppo_continuous.py"): {
        "header": True, "Args.kl_coef": True, "ppo_policy_loss": True, "decoupled_policy_loss": True,
        "minibatch_loss": [POLICY_LOSS, PPO_KL, r"clipfrac="],
        "main": [r'^ +\("obs", "actions", "behaviour_logprobs", ("proximal_logprobs", )?"advantages"'],
        "check_args": [RANGES, PPO_KL]},
    # VACO: V-trace, the TV filter, and its ablations (PPO's clip, and decoupled PPO's: V-trace + decoupled clip)
    ("ppo_continuous.py", "vaco_continuous.py"): {
        "header": True, "imports": [r"^from typing import"], "Args.clip_coef": True, "Args.clip_vloss": True,
        "Args.kl_coef": True, "Args.tv_threshold": True, "Args.tv_reference": True, "Args.rho_bar": True,
        "Args.c_bar": True, "Args.advantage_alignment": True, "Args.tv_filter": True, "Args.clip_reference": True,
        "vtrace_advantages": True, "estimate_advantages": True, "decoupled_policy_loss": True,
        "vaco_policy_loss": True, "minibatch_loss": True,
        "main": [r'^ +\("obs", "actions", "behaviour_logprobs", ("proximal_logprobs", )?"advantages"',
                 r"rho_clipped_fraction"],
        "check_args": [RANGES, PPO_KL + r"|clip_reference|--no-tv-filter"]},
    # GePPO: VACO's V-trace kept; its band and its learning-rate rule in place of the TV filter and the clips
    ("vaco_continuous.py", "geppo_continuous.py"): {
        "header": True, "imports": [r"^from typing import"], "Args.clip_coef": True, "Args.clip_vloss": True,
        "Args.tv_threshold": True, "Args.tv_reference": True, "Args.advantage_alignment": True, "Args.tv_filter": True,
        "Args.clip_reference": True, "Args.adapt_factor": True, "Args.rho_bar": [r"# GePPO"], "ppo_policy_loss": True, "geppo_policy_loss": True,
        "decoupled_policy_loss": True, "vaco_policy_loss": True, "minibatch_loss": True, "update_tv": True,
        "adapted_lr_scale": True, "train_step": [r"\blr\b|rate"],
        "main": [r"\blr\b|lr_scale|frac|anneal_lr|moved|update_tv|GePPO|saved = dict"],
        "check_args": [RANGES, r"clip_reference|--no-tv-filter"],
        "resume": [r"lr_scale"]},
    # vaco_async.py: VACO's method as it is, around actor processes and a learner (the machinery: every region
    # vaco_continuous.py lacks, the rollout of an actor, its options, checks, checkpoints and main; the parts its
    # checkpoints hold, every actor's noise generator in place of the snapshots and the lag draws; and the end of a
    # run, `finish`, which tells the actors to stop between the checkpoint and the evaluation, and also stops for
    # what the machinery cannot go on with, an actor lost under --sync or none left, with a checkpoint and exit 1)
    ("vaco_continuous.py", "vaco_async.py"): {
        "header": True, "imports": True, "Args": True, "Args.*": True, "make_envs": True, "RewardScaler": True, "PolicyBuffer": True,
        "collect_rollout": True, "main": True, "check_args": True, "checkpoint_of": True, "resume": True, "added": True,
        "load_checkpoint": [r'"(lag_rng|actor_generators)"\) if part not in checkpoint'], "finish": True,
        # under torchrun only the learner reads --resume (its file need exist on its node only), and the processes
        # torchrun started, not the checkpoint, count the actors
        "__main__": True},
}
# the method's functions that several scripts carry: one code in all of them
COPIES = {"ppo_policy_loss": ["ppo_continuous.py", "vaco_continuous.py", "vaco_async.py"],
          "decoupled_policy_loss": ["decoupled_ppo_continuous.py", "vaco_continuous.py", "vaco_async.py"],
          "vtrace_advantages": ["vaco_continuous.py", "geppo_continuous.py", "vaco_async.py"],
          "vaco_policy_loss": ["vaco_continuous.py", "vaco_async.py"]}


def regions(path):
    """[region of each line] of a script: "header" (above the imports: its comments and docstring), "imports", an
    option of Args ("Args.<field>", with its docstring and the comments above it), a top-level function or class
    (with its decorators, the comments above it and the snippet markers around it), or "__main__" (the block under
    `if __name__ == "__main__":`); a blank line takes the region of the line above it."""
    with open(os.path.join(ROOT, path)) as f:
        source = f.read()
    lines, tree = source.splitlines(), ast.parse(source)
    names = [None] * len(lines)
    spans = []  # (first line, last line, region), 1-based
    for node in tree.body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            spans.append((first, node.end_lineno, "imports"))
        elif isinstance(node, ast.ClassDef) and node.name == "Args":
            fields = [n for n in node.body if isinstance(n, ast.AnnAssign)]
            ends = [n.end_lineno for n in node.body]
            start = first
            for field in fields:  # a field runs to the end of the docstring after it
                after = [n for n in node.body if n.lineno > field.lineno]
                end = after[0].end_lineno if after and isinstance(after[0], ast.Expr) else field.end_lineno
                spans.append((start, end, f"Args.{field.target.id}"))
                start = end + 1
            spans.append((start, max(ends), "Args"))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            spans.append((first, node.end_lineno, node.name))
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            spans.append((first, node.end_lineno, "__main__"))  # what runs the script from the command line
    first_import = min(a for a, _, r in spans if r == "imports")
    spans.append((1, first_import - 1, "header"))
    for a, b, region in spans:
        for i in range(a - 1, b):
            names[i] = region
    for i, line in enumerate(lines):  # a comment belongs to what follows it, an end marker and a blank line to the above
        if names[i] is None and line.startswith("#") and not line.startswith("# --8<-- [end:"):
            names[i] = next(n for n in names[i + 1:] if n)
        elif names[i] is None:
            names[i] = names[i - 1] if i else "header"
    return lines, names


def unexpected_changes(base, sibling, allowed):
    """The changed lines of `diff base sibling` that `allowed` (a SIBLINGS entry) does not let through."""
    (old, old_regions), (new, new_regions) = regions(base), regions(sibling)
    own = {"old": set(old_regions) - set(new_regions), "new": set(new_regions) - set(old_regions)}
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    bad = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        for side, lines, names, span in (("-", old, old_regions, range(i1, i2)), ("+", new, new_regions, range(j1, j2))):
            for i in span:
                if lines[i].startswith("# --8<--"):
                    continue  # the snippet markers of the docs' excerpts: not code
                rule = allowed.get(names[i], allowed.get(names[i].split(".")[0] + ".*", False))
                if names[i] in own["old" if side == "-" else "new"] and allowed.get("added") and side == "+":
                    rule = True  # vaco_async.py's machinery: what only the sibling has
                if lines[i].strip() and not (rule is True or rule and any(re.search(p, lines[i]) for p in rule)):
                    bad.append(f"{side} {names[i]}: {lines[i].strip()}")
    return bad


@pytest.mark.floatfree
@pytest.mark.parametrize("base, sibling", SIBLINGS, ids=[f"{a[:-3]}-{b[:-3]}" for a, b in SIBLINGS])
def test_each_sibling_diff_is_the_method(base, sibling):
    # what a reader sees with `diff <base> <sibling>`: the method (and PPO's own PPO-KL option deleted, VACO's
    # decoupled clip added), not a second pipeline
    bad = unexpected_changes(base, sibling, SIBLINGS[(base, sibling)])
    assert not bad, f"diff {base} {sibling} changes more than the method:\n" + "\n".join(bad[:20])


@pytest.mark.floatfree
def test_the_diff_check_sees_a_change_outside_the_method(tmp_path, monkeypatch):
    # the same check on a sibling whose rollout and main were touched: both lines are reported
    with open(os.path.join(ROOT, "spo_continuous.py")) as f:
        source = f.read()
    source = source.replace("        done = termination | truncation\n", "        done = truncation | termination\n", 1)
    source = source.replace("    torch.set_num_threads(1)", "    torch.set_num_threads(2)", 1)
    (tmp_path / "spo_continuous.py").write_text(source)
    (tmp_path / "ppo_continuous.py").write_text(open(os.path.join(ROOT, "ppo_continuous.py")).read())
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    bad = unexpected_changes("ppo_continuous.py", "spo_continuous.py", SIBLINGS[("ppo_continuous.py", "spo_continuous.py")])
    assert bad == ["- collect_rollout: done = termination | truncation", "+ collect_rollout: done = truncation | termination",
                   "- main: torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give",
                   "+ main: torch.set_num_threads(2)  # tiny MLPs: thread hand-offs cost more than they give"]


@pytest.mark.floatfree
@pytest.mark.parametrize("name", COPIES)
def test_the_method_s_functions_are_one_code_in_every_script(name):
    sources = {}
    for script in COPIES[name]:
        lines, names = regions(script)
        sources[script] = [line for line, region in zip(lines, names) if region == name and line.strip()
                           and not line.startswith("# --8<--")]
    first = sources[COPIES[name][0]]
    assert first and all(lines == first for lines in sources.values()), name
