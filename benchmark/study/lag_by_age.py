"""Why a policy trained on stale data narrows or widens: the batch split by the age of the snapshot that acted.

Runs one of the MuJoCo scripts as it is (same flags, same numbers: nothing here draws a random number or
touches the training), and at every update, once the advantages are estimated and before any gradient step,
writes one row per snapshot age k (0 = the learner pi_T itself, K - 1 the oldest) of:

    samples           how many samples of the batch age-k actors produced
    advantage_mean    their mean advantage, in units of the batch's advantage std, centred on the batch mean
                      (what the loss sees after its normalisation)
    abs_z_mean        mean |a - mu_T(s)| / sigma_T over the action's dimensions: where pi_T finds their actions
                      (0.80 for samples drawn from pi_T itself)
    weight_mean       mean w = pi_T(a|s) / beta(a|s): how much likelier pi_T finds their actions than the actor did
    logstd_push       their part of the first gradient step on the log-std: the sum over these samples and the
                      action's dimensions of -dL/dlog sigma, with L the script's own `minibatch_loss` on the whole
                      batch at theta = pi_T (> 0 widens the policy, < 0 narrows it)
    logstd_push_centred   the same with the advantages centred within each age first (what it would be if no age
                      carried a lower or higher advantage than another)

and one row per update with age "all" for the batch, which also holds how far the last update moved the policy:
the exact KL(pi_{T-1} || pi_T) between the policies at this update's start and the last one's, averaged over this
batch's states and split into the part from the means (`move_kl_mean`) and the part from the std (`move_kl_std`),
and how the entropy changed during this update's first epoch (`entropy_change_first_epoch`) and in all of its
epochs (`entropy_change`). The per-sample log-std is a [batch, action] tensor passed in
place of the parameter, so that its gradient is each sample's part and the parts sum to the parameter's gradient.

    python benchmark/study/lag_by_age.py decoupled_ppo_continuous.py --out hopper_decoupled_k32.csv \
        -- --env-id Hopper-v4 --policy-buffer 32 --seed 1
    python benchmark/study/lag_by_age.py vaco_continuous.py --out hopper_vtrace_k32.csv \
        -- --env-id Hopper-v4 --policy-buffer 32 --no-tv-filter --clip-reference proximal --seed 1

Every script whose main calls `estimate_advantages(agent, b, args)` and `PolicyBuffer.sample_ages` works:
ppo_continuous.py, decoupled_ppo_continuous.py, spo_continuous.py, vaco_continuous.py and geppo_continuous.py. The run's TensorBoard log goes
to runs/ under the working folder, as the script's own would.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT, import_script, write_csv  # noqa: E402

COLUMNS = ["update", "step", "age", "samples", "advantage_mean", "abs_z_mean", "weight_mean", "logstd_push",
           "logstd_push_centred", "entropy", "move_kl_mean", "move_kl_std", "entropy_change_first_epoch",
           "entropy_change"]


@dataclass
class Args:
    script: tyro.conf.Positional[str]
    """the script to run, e.g. decoupled_ppo_continuous.py (a top-level script of this repository, or a path)"""
    out: str
    """the CSV to write, one row per update and snapshot age (refused if it exists)"""


def per_sample_logstd_push(module, agent, flat, args, advantages):
    """[batch] -dL/dlog sigma of each sample at theta = pi_T (summed over the action's dimensions), L the
    script's `minibatch_loss` on the whole batch as one minibatch, with `advantages` in place of the batch's."""
    params = {name: p.detach() for name, p in agent.named_parameters()}
    logstd = params["actor.logstd"].expand(len(flat["obs"]), -1).clone().requires_grad_()
    loss, _ = module.minibatch_loss({**params, "actor.logstd": logstd}, agent, {**flat, "advantages": advantages},
                                    args)
    (grad,) = torch.autograd.grad(loss, [logstd])
    return -grad.sum(-1)


def centred_by_age(advantages, ages):
    """The advantages less the mean of their age's."""
    centred = advantages.clone()
    for age in ages.unique():
        centred[ages == age] -= advantages[ages == age].mean()
    return centred


def gaussian_kl_parts(mean_p, logstd_p, mean_q, logstd_q):
    """KL(p || q) of diagonal Gaussians per row, as (the part from the means, the part from the std):
        sum_j (mu_p - mu_q)^2 / (2 sigma_q^2)   and   sum_j log(sigma_q / sigma_p) + sigma_p^2 / (2 sigma_q^2) - 1/2"""
    var_q = (2 * logstd_q).exp()
    from_means = ((mean_p - mean_q) ** 2 / (2 * var_q)).sum(-1)
    from_std = (logstd_q - logstd_p + (2 * logstd_p).exp() / (2 * var_q) - 0.5).sum(-1)
    return from_means, from_std


@torch.no_grad()
def age_rows(module, agent, b, estimates, env_ages, args, previous=None):
    """The rows of one update: per age, then the whole batch as age "all"."""
    batch = {**b, **estimates}
    flat = {key: value.reshape(-1, *value.shape[2:]) for key, value in batch.items()}
    flat["ages"] = ages = torch.as_tensor(env_ages).expand(b["rewards"].shape).reshape(-1)
    mean, logstd = agent.actor(flat["obs"])
    z = (flat["actions"] - mean) / logstd.exp()
    weight = (estimates["proximal_logprobs"] - b["behaviour_logprobs"]).exp().reshape(-1)
    advantages = flat["advantages"]
    standardised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    with torch.enable_grad():
        push = per_sample_logstd_push(module, agent, flat, args, advantages)
        push_centred = per_sample_logstd_push(module, agent, flat, args, centred_by_age(advantages, ages))
    groups = [(str(int(age)), ages == age) for age in ages.unique()] + [("all", torch.ones_like(ages, dtype=bool))]
    entropy = module.gaussian_entropy(logstd[0]).item()
    move = gaussian_kl_parts(*previous(flat["obs"]), mean, logstd) if previous is not None else (torch.zeros(1),) * 2
    rows = [dict(age=name, samples=int(mask.sum()), advantage_mean=standardised[mask].mean().item(),
                 abs_z_mean=z[mask].abs().mean().item(), weight_mean=weight[mask].mean().item(),
                 logstd_push=push[mask].sum().item(), logstd_push_centred=push_centred[mask].sum().item(),
                 entropy=entropy) for name, mask in groups]
    rows[-1].update(move_kl_mean=move[0].mean().item(), move_kl_std=move[1].mean().item())
    return rows


def instrument(module, rows):
    """Wrap `module`'s `PolicyBuffer.sample_ages` (to learn each actor's age), `estimate_advantages` (to measure the
    batch before any step), its update step (to follow the log-std through the epochs) and `PolicyBuffer.push` (to
    add the update's rows to `rows` once its epochs are done); returns nothing, leaves what they compute as it was."""
    sample_ages, estimate_advantages = module.PolicyBuffer.sample_ages, module.estimate_advantages
    push, compiled_or_eager = module.PolicyBuffer.push, module.compiled_or_eager
    state = dict(ages=None, update=0, step=0, current=None, pending=None, logstd_sums=[])

    def recording_sample_ages(self, num_actors, rng):
        state["ages"], groups = sample_ages(self, num_actors, rng)
        # pi_T and pi_{T-1}: the snapshots are frozen copies, so holding one keeps it as it was, even at K = 1
        state["previous"], state["current"] = state["current"], self[0]
        return state["ages"], groups

    def diagnosed_estimate_advantages(agent, b, args):
        estimates = estimate_advantages(agent, b, args)
        state["update"] += 1
        state["step"] += args.batch_size
        state["pending"] = age_rows(module, agent, b, estimates, state["ages"], args, state["previous"])
        state["logstd_sums"] = [agent.actor.logstd.sum().item()]
        state["steps_per_epoch"] = args.num_minibatches
        return estimates

    def followed(step, enabled):  # the step as the script would run it, then the log-std's sum, outside of it
        update = compiled_or_eager(step, enabled)

        def update_and_follow(params, *rest):
            stats = update(params, *rest)
            state["logstd_sums"].append(params["actor.logstd"].sum().item())
            return stats

        return update_and_follow

    def writing_push(self, actor):
        push(self, actor)
        if state["pending"] is None:  # the initial policy, or a resumed run's snapshots
            return
        sums = state["logstd_sums"]  # the entropy is the log-std's sum plus a constant
        first_epoch = sums[min(state["steps_per_epoch"], len(sums) - 1)]
        state["pending"][-1].update(entropy_change_first_epoch=first_epoch - sums[0], entropy_change=sums[-1] - sums[0])
        rows.extend({"update": state["update"], "step": state["step"], **row} for row in state["pending"])
        state["pending"] = None

    module.PolicyBuffer.sample_ages = recording_sample_ages
    module.estimate_advantages = diagnosed_estimate_advantages
    module.compiled_or_eager = followed
    module.PolicyBuffer.push = writing_push


def main(args: Args, script_flags):
    path = args.script if os.path.isfile(args.script) else os.path.join(ROOT, args.script)
    if not os.path.isfile(path):
        sys.exit(f"error: no script {args.script}")
    if os.path.exists(args.out):
        sys.exit(f"error: {args.out} exists; remove it or choose another --out")
    module = import_script(path, os.path.basename(path)[: -len(".py")])
    if not hasattr(module, "PolicyBuffer") or not hasattr(module, "estimate_advantages"):
        sys.exit(f"error: {args.script} has no PolicyBuffer and estimate_advantages to instrument")
    script_args = tyro.cli(module.Args, args=script_flags)
    rows = []
    instrument(module, rows)
    try:
        module.main(script_args)
    finally:  # a run stopped halfway (an error, Ctrl-C) keeps the updates it finished
        write_csv(args.out, rows, COLUMNS)
        print(f"wrote {args.out} ({rows[-1]['update'] if rows else 0} updates)")


if __name__ == "__main__":
    argv = sys.argv[1:]  # before --: this tool's flags; after: the script's
    split = argv.index("--") if "--" in argv else len(argv)
    main(tyro.cli(Args, args=argv[:split]), argv[split + 1 :])
