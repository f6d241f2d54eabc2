# VACO for continuous control (MuJoCo) with asynchronous actor processes and a learner on
# torch.distributed (gloo). Single file, CleanRL style. Docs: docs/vaco_async.md (`# --8<--`: its excerpts)
"""VACO (total Variation-based Advantage aligned Constrained policy Optimization), arXiv 2603.01365,
whose actors are real processes that act with whatever policy they last received.

``vaco_continuous.py`` simulates policy lag with a buffer of policy snapshots; here the lag arises
as in a distributed system. Rank 0 is the learner, ranks 1..N are actors, and they talk only
through torch.distributed (gloo backend, CPU tensors, point-to-point after start-up):

    actor r (num_envs / N envs)                      learner (rank 0)
    act with the newest version received  --- segment of num_steps steps --->  communication thread:
    (its weights and observation                                                queue -> batch of N segments
     statistics)                          <-- reply [version, code, weights]   -> VACO update -> version + 1

A segment waits in the queue while the learner trains, so it can be several versions old when it
is used: its lag = learner version at use - the version that acted. A full queue holds the next
reply back, so the actors wait: that bounds the lag. VACO answers the two kinds of lag:

1. Advantage alignment (backward lag: the learner pi_T already differs from the behaviour policy
   beta that acted). Once per update, before any gradient step, V-trace estimates the advantages
   of pi_T from beta's data, with clipped weights pi_T/beta; the critic regresses on V-trace targets.
2. TV filtering (forward lag: pi_theta drifts from beta over many minibatch steps). Per minibatch,
   TV(pi_theta, beta) ~ 1/2 mean|rho - 1|, rho = pi_theta/beta. Above a threshold delta, every
   sample whose update would increase the divergence (A and rho - 1 of the same sign) has its gradient
   detached. No ratio clipping.

Everything but acting is ``vaco_continuous.py``'s: ``diff vaco_continuous.py vaco_async.py`` shows
the distributed machinery, and ``--sync --num-actors 1`` trains exactly as
``vaco_continuous.py --policy-buffer 1``.

    python vaco_async.py --env-id Ant-v4 --num-actors 2    # the learner and 2 actor processes, here
    python vaco_async.py --env-id Hopper-v4 --sync          # lag 0 by construction (the baseline)
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        vaco_async.py --env-id Ant-v4 --num-envs 14         # rank 0 learns, the 7 others act
    tensorboard --logdir runs
"""

import collections
import dataclasses
import datetime
import difflib
import functools
import itertools
import os
import pickle
import queue
import signal
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field, replace
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # Algorithm specific arguments
    env_id: str = "Hopper-v4"
    """the id of the environment (a MuJoCo task, v4 or v5)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments in all, split evenly across the actors"""
    num_steps: int = 256
    """the number of steps each env runs per segment (8 x 256: CleanRL's batch of 2048 per update)"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the number of epochs over each batch"""
    norm_adv: bool = True
    """Toggles advantages normalization (per minibatch)"""
    clip_coef: float = 0.2
    """the clipping coefficient of the `--no-tv-filter` ablation and `--clip-vloss` (clipfrac counts past it)"""
    clip_vloss: bool = False
    """clip the value loss as PPO does; off by default: the critic regresses on V-trace targets"""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (stops the epochs of an update early)"""

    # VACO
    tv_threshold: float = 0.1
    """delta: filter samples once the minibatch's TV(pi_theta, reference) exceeds it"""
    tv_reference: Literal["behaviour", "proximal"] = "behaviour"
    """what the TV filter measures against: beta, the paper's rule (backward and forward lag together),
    or pi_T, the learner at the update's start (forward drift only); the ratio stays pi_theta/beta"""
    rho_bar: float = 1.0
    """V-trace: clip of the weights w = pi_T/beta in the TD errors (rho-bar)"""
    c_bar: float = 1.0
    """V-trace: clip of the weights w in the trace (c-bar)"""
    advantage_alignment: bool = True
    """V-trace advantages of pi_T, the learner at the update's start; `--no-advantage-alignment` uses GAE (ablation)"""
    tv_filter: bool = True
    """TV filtering; `--no-tv-filter` uses PPO's clipped surrogate instead (ablation; with
    `--no-advantage-alignment --clip-vloss` too, it is PPO)"""
    clip_reference: Literal["behaviour", "proximal"] = "behaviour"
    """with `--no-tv-filter`, what the clip is centred on: beta (PPO's clip), or pi_T with the weight pi_T/beta
    (decoupled PPO's, Hilton et al. 2021: V-trace's advantages under decoupled PPO's trust region)"""

    # Actors and learner (torch.distributed, gloo)
    num_actors: Optional[int] = None
    """actor processes, ranks 1..N (rank 0 learns); default 1, or WORLD_SIZE - 1 under torchrun"""
    sync: bool = False
    """every update takes one segment per actor, all acted with the current version (lag 0)"""
    max_policy_lag: Optional[int] = None
    """drop segments more than this many versions old (they count in the statistics, not the budget)"""
    queue_batches: int = 1
    """batches of segments the learner may hold; a full queue holds the actors back (bounds the lag)"""
    actor_delay_ms: float = 0.0
    """lag on demand: actor r sleeps r x this many ms before sending each segment (stragglers)"""
    actor_timeout: float = 60.0
    """seconds an actor that owes the learner a segment may stay silent before it is counted lost"""
    stop_on_actor_loss: bool = False
    """stop (checkpoint, exit non-zero) when an actor is lost, instead of carrying on without it"""
    master_port: int = 0
    """local launch: the learner's rendezvous port on 127.0.0.1 (0: any free one); torchrun sets its own"""

    # Run management: naming, logging, checkpoints, evaluation, speed
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment: with `--sync`, same seed, machine and flags give the same returns"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (env 0 of actor 1, saved to `videos/<run_name>`)"""
    save_model: bool = False
    """whether to save a checkpoint to `runs/<run_name>/` and then evaluate it"""
    eval_episodes: int = 10
    """episodes of deterministic evaluation of the saved checkpoint (with `--save-model`)"""
    checkpoint_every: int = 0
    """with `--save-model`, also save a checkpoint every this many updates (0: only at the end)"""
    resume: Optional[str] = None
    """continue a run from a checkpoint it saved, with its settings (the envs start new episodes; the logs go to a new
    run folder); only its length, name, logs, checkpoints, evaluation, compile, layout of envs and actors, port and
    fault handling (--actor-timeout, --stop-on-actor-loss) may change"""
    compile: bool = True
    """compile the minibatch update (loss, gradient, clipping, Adam) into one program with torch.compile,
    paid once at the first update (`--no-compile`: the same function, eagerly)"""

    # computed from the options above at the start, not options themselves
    batch_size: int = field(default=0, init=False)  # num_envs * num_steps
    minibatch_size: int = field(default=0, init=False)  # batch_size // num_minibatches
    num_iterations: int = field(default=0, init=False)  # updates: total_timesteps // batch_size


class WithoutInfo(gym.Wrapper):
    """The env's step without its info (reward terms, positions): never read here, batched by SyncVectorEnv."""

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, reward, terminated, truncated, {}


def make_envs(args, run_name):
    env_fns = [lambda: WithoutInfo(gym.make(args.env_id)) for _ in range(args.num_envs)]
    if args.capture_video:  # env 0 films its episodes
        if "DISPLAY" not in os.environ:
            os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, read when the renderer is made
        env_fns[0] = lambda: gym.wrappers.RecordVideo(gym.make(args.env_id, render_mode="rgb_array"),
                                                      f"videos/{run_name}")
    envs = gym.vector.SyncVectorEnv(  # the actor processes take the place of AsyncVectorEnv
        env_fns,
        # SAME_STEP: a finished sub-env resets within the step and hands back its last observation
        # in infos["final_obs"]. So no dummy transition (NEXT_STEP's reset step, whose action is
        # ignored) enters the batch, and truncations can bootstrap from V(final observation).
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        copy=False,  # the rollout copies what it keeps of each step's observations
    )
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        sys.exit(f"error: {args.env_id} has a {type(envs.single_action_space).__name__} action space; "
                 "this script needs a continuous (Box) one")
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def with_final_obs(obs, infos):
    """s_{t+1} of each env, after a step where some episode ended: the observation returned by the step,
    or, where the env's episode ended, its last observation, which SAME_STEP autoreset moved to infos["final_obs"]."""
    obs = obs.copy()
    for i in np.flatnonzero(infos["_final_obs"]):
        obs[i] = infos["final_obs"][i]
    return obs


class RunningMeanStd(gym.wrappers.utils.RunningMeanStd):
    """gymnasium's running mean and variance over batches (Chan et al.'s parallel algorithm), in float64."""

    def update(self, x):
        x = np.asarray(x, dtype=np.float64)  # float64 sums, whatever the observations' dtype
        batch_mean = np.add.reduce(x, axis=0) / len(x)  # np.mean's and np.var's operations, without their checks
        self.update_from_moments(batch_mean, np.add.reduce(np.square(x - batch_mean), axis=0) / len(x), len(x))


def normalize_obs(obs, obs_rms, clip=10.0):
    """(o - mean) / std, clipped: what gymnasium's NormalizeObservation + a clip wrapper do, but
    kept in the script so that final observations (truncation bootstrap) and checkpoints see the
    very same statistics."""
    return np.clip((obs - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -clip, clip).astype(np.float32)


class RewardScaler:
    """Divide rewards by the std of the discounted return, then clip (gymnasium's NormalizeReward).
    Keeps the critic's targets O(1) whatever the task's reward scale."""

    def __init__(self, num_envs, gamma, clip=10.0):
        self.returns = np.zeros(num_envs)
        self.return_rms = RunningMeanStd()
        self.gamma, self.clip = gamma, clip

    def __call__(self, rewards, dones, envs=slice(None)):
        returns = self.returns[envs]  # `envs`: the envs these rewards come from (a view, updated in place)
        returns[:] = returns * self.gamma + rewards
        self.return_rms.update(returns)
        returns[dones] = 0.0  # a new episode starts a new discounted return
        return np.clip(rewards / np.sqrt(self.return_rms.var + 1e-8), -self.clip, self.clip)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, out_dim, out_std):
    """64-64 tanh MLP, orthogonal init; the output layer's gain sets the initial output scale."""
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, 64)),
        nn.Tanh(),
        layer_init(nn.Linear(64, out_dim), std=out_std),
    )


class Actor(nn.Module):
    """Gaussian policy: an MLP for the mean, a state-independent log-std."""

    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.mean = mlp(obs_dim, act_dim, out_std=0.01)  # near-zero initial means
        self.logstd = nn.Parameter(torch.zeros(1, act_dim))

    def forward(self, obs):
        mean = obs
        for layer in self.mean:  # each layer's forward itself: for the actors' 1-8 observations a module call
            mean = layer.forward(mean)  # costs more than the layer's arithmetic
        return mean, self.logstd.expand_as(mean)


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor = Actor(obs_dim, act_dim)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def forward(self, obs):
        """(action mean, action log-std, value) of a batch of observations."""
        return *self.actor(obs), self.get_value(obs)


def gaussian_logprob(action, mean, logstd):
    """log N(action; mean, exp(logstd)) of the joint action (summed over its dimensions)."""
    return (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - 0.5 * np.log(2 * np.pi)).sum(-1)


def gaussian_entropy(logstd):
    return (0.5 + 0.5 * np.log(2 * np.pi) + logstd).sum(-1)


def act(actor, obs, generator):
    """Sample an action for every env from the actor's policy; returns (action, mean, log-std) of its Gaussians."""
    mean, logstd = actor(obs)
    action = mean + logstd.exp() * torch.randn(mean.shape, generator=generator)
    return action, mean, logstd


# --8<-- [start:rollout]
@torch.inference_mode()  # acting needs no gradients
def collect_rollout(envs, actor, obs_rms, current_obs, rollout, generator):
    """Step the envs `num_steps` times with `actor` (observation statistics updated at every step),
    writing the transitions into `rollout` (a segment's fields) with the raw rewards and observations
    and the episodes that ended. Returns the normalised observation to continue from."""
    rollout["episode_returns"][:] = rollout["episode_lengths"][:] = 0.0
    means = np.zeros(rollout["actions"].shape, np.float32)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    for step in range(rollout["obs"].shape[0]):
        rollout["obs"][step] = current_obs
        action, mean, logstd = act(actor, torch.as_tensor(current_obs), generator)
        rollout["actions"][step], means[step] = action.numpy(), mean.numpy()

        raw_obs, reward, termination, truncation, infos = envs.step(np.clip(action.numpy(), low, high))
        done = termination | truncation
        rollout["rewards"][step], rollout["raw_obs"][step] = reward, raw_obs  # the learner scales and folds them in
        rollout["terminations"][step], rollout["dones"][step] = termination, done
        obs_rms.update(raw_obs)
        current_obs = normalize_obs(raw_obs, obs_rms)
        rollout["next_obs"][step] = (normalize_obs(with_final_obs(raw_obs, infos), obs_rms) if done.any()
                                     else current_obs)
        if done.any():
            for i in np.flatnonzero(infos["_episode"]):
                rollout["episode_returns"][step, i] = infos["episode"]["r"][i]
                rollout["episode_lengths"][step, i] = infos["episode"]["l"][i]
    # the behaviour log-probabilities, all steps at once (the log-std is the same at every step)
    rollout["behaviour_logprobs"][:] = gaussian_logprob(torch.as_tensor(rollout["actions"], dtype=torch.float32),
                                              torch.as_tensor(means), logstd).numpy()
    return current_obs
# --8<-- [end:rollout]


# --8<-- [start:compute_gae]
def compute_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """Generalized Advantage Estimation. All inputs are float tensors shaped [T, N] (time-major).

    next_values[t] = V(s_{t+1}), of the final observation when the episode was truncated at t;
    terminations[t] = 1 when s_{t+1} is terminal (nothing to bootstrap); dones[t] = 1 when the
    episode ended at t for any reason (the trace is cut there).
        TD_t = r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t)
        A_t  = TD_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
    """
    deltas = rewards + gamma * (1.0 - terminations) * next_values - values
    discounts = gamma * lam * (1.0 - dones)
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):  # only the recursion is sequential
        lastgaelam = deltas[t] + discounts[t] * lastgaelam
        advantages[t] = lastgaelam
    return advantages
# --8<-- [end:compute_gae]


# --8<-- [start:vtrace_advantages]
def vtrace_advantages(behaviour_logprobs, proximal_logprobs, rewards, values, next_values,
                      terminations, dones, gamma, lam, rho_bar=1.0, c_bar=1.0):
    """All inputs are float tensors shaped [T, N] (time-major); returns (advantages, value_targets).

    V-trace (IMPALA) with lambda: the value and advantages of pi_T, the learner at the update's start,
    from data of the behaviour policy beta; V-trace's rho_t is the weight w_t. Same conventions as `compute_gae`.
        w_t = pi_T(a_t|s_t) / beta(a_t|s_t),  c_t = min(c_bar, w_t)
        TD_t = min(rho_bar, w_t) * (r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t))
        v_t - V(s_t) = TD_t + gamma * lam * (1 - done_t) * c_t * (v_{t+1} - V(s_{t+1})),  zero after T
    value_targets = v_t. The advantages are the lambda-weighted policy-gradient form
        A_t = r_t + gamma * (1 - term_t) * [V(s_{t+1}) + lam * (1 - done_t) * (v_{t+1} - V(s_{t+1}))] - V(s_t)
    With beta = pi_T (all w = 1, c = 1) v_t - V(s_t) and A_t are both exactly GAE(lambda).
    """
    weight = torch.exp(proximal_logprobs - behaviour_logprobs)
    deltas = torch.clamp(weight, max=rho_bar) * (rewards + gamma * (1.0 - terminations) * next_values - values)
    discounts = gamma * (1.0 - dones) * lam * torch.clamp(weight, max=c_bar)
    vs_minus_values = torch.zeros_like(rewards)
    acc = torch.zeros_like(rewards[0])
    for t in reversed(range(rewards.shape[0])):  # only the recursion is sequential
        acc = deltas[t] + discounts[t] * acc
        vs_minus_values[t] = acc
    # v_{t+1} - V(s_{t+1}), zero beyond the last step (the trace is cut at dones by the (1 - done_t) below)
    next_vs_minus_values = torch.cat([vs_minus_values[1:], torch.zeros_like(vs_minus_values[:1])])
    advantages = (rewards + gamma * (1.0 - terminations)
                  * (next_values + lam * (1.0 - dones) * next_vs_minus_values) - values)
    return advantages, values + vs_minus_values
# --8<-- [end:vtrace_advantages]


# --8<-- [start:estimate_advantages]
@torch.no_grad()
def estimate_advantages(agent, b, args):
    """Advantage alignment: advantages of pi_T, the learner at the update's start (not of the stale
    behaviour policies), by V-trace, and V-trace value targets (`returns`) for the critic, from the
    learner's current critic, with pi_T's log-probabilities of the batch actions (`proximal_logprobs`).
    Returns {values, proximal_logprobs, advantages, returns}, each shaped [T, N]."""
    values = agent.get_value(b["obs"])
    next_values = agent.get_value(b["next_obs"])
    proximal_logprobs = gaussian_logprob(b["actions"], *agent.actor(b["obs"]))
    if not args.advantage_alignment:  # ablation: GAE, as if beta were pi_T
        advantages = compute_gae(b["rewards"], values, next_values, b["terminations"], b["dones"],
                                 args.gamma, args.gae_lambda)
        returns = advantages + values
    else:
        advantages, returns = vtrace_advantages(
            b["behaviour_logprobs"], proximal_logprobs, b["rewards"], values, next_values, b["terminations"],
            b["dones"], args.gamma, args.gae_lambda, args.rho_bar, args.c_bar,
        )
    return dict(values=values, proximal_logprobs=proximal_logprobs, advantages=advantages, returns=returns)
# --8<-- [end:estimate_advantages]


# --8<-- [start:ppo_policy_loss]
def ppo_policy_loss(newlogprob, behaviour_logprobs, advantages, clip_coef):
    """PPO's clipped surrogate, with the ratio taken against the behaviour policy that acted:
        L = -mean(min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)),   rho = pi_theta(a|s) / beta(a|s)
    Returns (loss, ratio)."""
    ratio = (newlogprob - behaviour_logprobs).exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(pg_loss1, pg_loss2).mean(), ratio
# --8<-- [end:ppo_policy_loss]


def decoupled_policy_loss(newlogprob, behaviour_logprobs, proximal_logprobs, advantages, clip_coef, max_weight=100.0):
    """Decoupled PPO (Hilton, Cobbe, Schulman 2021, arXiv 2110.00641): the clip is centred on pi_T, the
    learner at the update's start, and the weight w corrects for the stale behaviour policy beta:
        L = -mean( w * min(r * A, clip(r, 1 - eps, 1 + eps) * A) ),  r = pi_theta/pi_T,  w = sg(min(pi_T/beta, 100))
    A sample stale at the update's start is weighted, not clipped away as PPO's pi_theta/beta clips it. The
    cap only guards against blow-ups, as in the authors' code (charts/backward_ratio_max shows if it binds).
    As w > 0, a term is w r A (= rho A, rho = pi_theta/beta) except where the clip binds (A > 0 and r > 1 +
    eps, or A < 0 and r < 1 - eps): there the constant w clip(r) A. So at zero lag (pi_T = beta) the gradient
    is PPO's to the bit, even where log pi_T and log beta differ in their last bits (unless r and rho fall on
    either side of 1 +- eps). Returns (loss, ratio, proximal_ratio): rho and r."""
    logratio = newlogprob - behaviour_logprobs
    ratio = logratio.exp()  # rho = w r
    proximal_ratio = (newlogprob - proximal_logprobs).exp()  # r
    weight = (proximal_logprobs - behaviour_logprobs).exp()  # w, before the cap (no gradient: both are data)
    # min(w, 100) r; rho's log clamped at 80, far beyond any ratio that trains, since an exp that
    # overflowed would turn the unused branch's zero gradient into NaN
    finite_ratio = logratio.clamp(max=80.0).exp()
    weighted_ratio = torch.where(weight > max_weight, max_weight * proximal_ratio, finite_ratio)
    clipped = torch.where(advantages > 0, proximal_ratio > 1 + clip_coef, proximal_ratio < 1 - clip_coef)
    clipped_term = weight.clamp(max=max_weight) * torch.clamp(proximal_ratio, 1 - clip_coef, 1 + clip_coef) * advantages
    surrogate = torch.where(clipped, clipped_term.detach(), weighted_ratio * advantages)
    return -surrogate.mean(), ratio, proximal_ratio


# --8<-- [start:vaco_policy_loss]
def vaco_policy_loss(newlogprob, behaviour_logprobs, advantages, tv_threshold, proximal_logprobs=None):
    """TV filtering. Returns (loss, ratio, tv, filtered_fraction).

        rho = pi_theta(a|s) / beta(a|s),   the surrogate's importance ratio
        q = pi_theta(a|s) / pi_ref(a|s),   pi_ref = beta (the paper), or pi_T (`proximal_logprobs`)
        TV(pi_theta, pi_ref) ~ tv = 1/2 mean|q - 1|
        if tv > delta: filter a sample when A * sign(q - 1) > 0, i.e. when following its gradient
                       would move q further from 1 (the policy further from pi_ref)
        L = -mean( rho * A for kept samples,  sg(rho * A) for filtered ones )
    Filtered samples give zero gradient but stay in the mean's denominator. No ratio clipping.
    """
    ratio = (newlogprob - behaviour_logprobs).exp()
    if proximal_logprobs is None:  # the paper's rule: the reference is the behaviour policy
        deviation = ratio.detach() - 1
    else:
        deviation = (newlogprob.detach() - proximal_logprobs).exp() - 1
    tv = 0.5 * deviation.abs().mean()
    filtered = (advantages * deviation > 0) & (tv > tv_threshold)  # A * (q - 1) > 0: same sign
    surrogate = ratio * advantages
    surrogate = torch.where(filtered, surrogate.detach(), surrogate)
    return -surrogate.mean(), ratio, tv, filtered.float().mean()
# --8<-- [end:vaco_policy_loss]


# --8<-- [start:minibatch_loss]
def minibatch_loss(params, agent, mb, args):
    """The loss of one minibatch as a function of the parameters `params` ({name: tensor} of `agent`; None: its own),
    so that `train_step` can differentiate it. Returns (loss, {statistic: value} to log)."""
    mean, logstd, newvalue = (agent(mb["obs"]) if params is None
                              else torch.func.functional_call(agent, params, (mb["obs"],)))
    newlogprob = gaussian_logprob(mb["actions"], mean, logstd)
    entropy = gaussian_entropy(logstd)

    mb_advantages = mb["advantages"]
    if args.norm_adv:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

    # Policy loss; ratio = pi_theta/beta, clip_ratio = the ratio clipfrac counts past clip_coef
    if args.tv_filter:  # TV filtering (no ratio clipping)
        reference = mb["proximal_logprobs"] if args.tv_reference == "proximal" else None
        pg_loss, ratio, tv, filtered_fraction = vaco_policy_loss(newlogprob, mb["behaviour_logprobs"], mb_advantages,
                                                                 args.tv_threshold, reference)
        clip_ratio = ratio
    elif args.clip_reference == "proximal":  # ablation: decoupled PPO's clip, centred on pi_T
        pg_loss, ratio, clip_ratio = decoupled_policy_loss(newlogprob, mb["behaviour_logprobs"],
                                                           mb["proximal_logprobs"], mb_advantages, args.clip_coef)
    else:  # ablation: PPO's clipped surrogate
        pg_loss, ratio = ppo_policy_loss(newlogprob, mb["behaviour_logprobs"], mb_advantages, args.clip_coef)
        clip_ratio = ratio
    logratio = newlogprob - mb["behaviour_logprobs"]
    # k3 estimator of KL(behaviour || policy) from behaviour samples: (rho - 1) - log rho
    kl = ((ratio - 1) - logratio).mean()

    # Value loss
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb["returns"]) ** 2
        v_clipped = mb["values"] + torch.clamp(newvalue - mb["values"], -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - mb["returns"]) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

    stats = dict(policy_loss=pg_loss, value_loss=v_loss, entropy=entropy_loss, old_approx_kl=(-logratio).mean(),
                 approx_kl=kl, clipfrac=((clip_ratio - 1.0).abs() > args.clip_coef).float().mean(),
                 tv_divergence=0.5 * (ratio - 1).abs().mean())
    if args.tv_filter:  # filter_tv: the TV compared with delta
        stats.update(filtered_fraction=filtered_fraction, filter_on_fraction=(tv > args.tv_threshold).float(),
                     filter_tv=tv)
    return loss, {name: value.detach() for name, value in stats.items()}
# --8<-- [end:minibatch_loss]


# --8<-- [start:train_step]
def adam_state(params):
    """Adam's state for `params`: the step count t and the moment estimates m and v."""
    return {"step": torch.zeros(()),
            "exp_avg": {name: torch.zeros_like(p) for name, p in params.items()},
            "exp_avg_sq": {name: torch.zeros_like(p) for name, p in params.items()}}


def train_step(params, adam, flat, indices, lr, agent, args):
    """One optimiser step on the minibatch flat[indices]: the gradient of the loss, clipped by its
    global norm, then Adam. Updates `params` (the agent's parameters) and `adam` in place and
    returns the minibatch's statistics. One function of tensors in and out, so that torch.compile
    can make it one program; `lr` is a tensor, so annealing it does not recompile."""
    mb = {key: value[indices] for key, value in flat.items()}
    if torch.compiler.is_compiling():  # torch.func.grad is traced into the compiled program
        grads, stats = torch.func.grad(minibatch_loss, has_aux=True)(params, agent, mb, args)
    else:  # eagerly: the agent's own parameters and torch.autograd.grad, the same gradient at less cost
        loss, stats = minibatch_loss(None, agent, mb, args)
        grads = dict(zip(params, torch.autograd.grad(loss, list(agent.parameters()))))

    # gradient clipping: g <- g * min(1, max_grad_norm / ||g||), ||g|| over all parameters
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    scale = torch.clamp(args.max_grad_norm / (norm + 1e-6), max=1.0)

    # Adam (as torch.optim.Adam, eps = 1e-5): t <- t + 1,  m <- b1 m + (1 - b1) g,
    # v <- b2 v + (1 - b2) g^2,  p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    beta1, beta2, eps = 0.9, 0.999, 1e-5
    adam["step"].add_(1)
    bias1, bias2 = 1 - beta1 ** adam["step"], 1 - beta2 ** adam["step"]  # once a step, not once a tensor
    for name, p in params.items():
        g = grads[name] * scale
        m = adam["exp_avg"][name].mul_(beta1).add_((1 - beta1) * g)
        v = adam["exp_avg_sq"][name].mul_(beta2).add_((1 - beta2) * g * g)
        p.sub_(lr * (m / bias1) / ((v / bias2).sqrt() + eps))
    return stats
# --8<-- [end:train_step]


# --- Messages: each one float64 tensor of a size both sides derive from the learner's settings ---
# (a receiver posts a buffer of the right size). float64 carries the float32 weights, the raw
# observations, the statistics and integers exactly. Tags keep the two kinds apart.
# --8<-- [start:messages]
REPLY_TAG, SEGMENT_TAG = 1, 2
CONTINUE, STOP, DISMISSED = 0, 1, 2  # reply codes: act on; the run is over; you were counted lost
# A reply: [version, code, then that version's policy as `pack_policy` packs it].


class SegmentLayout:
    """A segment, what an actor sends after `num_steps` steps of its `num_envs` envs, as one flat
    message: the transitions as it acted on them (observations normalised with its statistics of
    the moment), the raw observations it folded into those statistics (the learner folds in the
    same), and its action-noise generator's state (a resumed run continues it). First the sender's
    rank, its segment number (0: the envs were just reset), the behaviour version, and its seconds
    spent waiting for the learner and since it started."""

    def __init__(self, num_steps, num_envs, obs_dim, act_dim):
        T, n, rng = num_steps, num_envs, torch.Generator().get_state().numel()
        self.shapes = dict(rank=(1,), index=(1,), version=(1,), wait_time=(1,), run_time=(1,),
                           obs=(T, n, obs_dim), next_obs=(T, n, obs_dim), reset_obs=(n, obs_dim),
                           raw_obs=(T, n, obs_dim), actions=(T, n, act_dim), behaviour_logprobs=(T, n), rewards=(T, n),
                           terminations=(T, n), dones=(T, n), episode_returns=(T, n),
                           episode_lengths=(T, n), rng_state=(rng,))
        self.size, self.steps = sum(int(np.prod(shape)) for shape in self.shapes.values()), T * n

    def views(self, message):
        """{field: numpy array viewing `message`}: writing a field writes the message (no packing copy)."""
        fields, start = {}, 0
        for name, shape in self.shapes.items():
            fields[name] = message.numpy()[start : start + int(np.prod(shape))].reshape(shape)
            start += int(np.prod(shape))
        return fields


def pack_policy(actor, obs_rms):
    """What an actor needs to act, as one new tensor: the actor's parameters and the observation
    statistics, together under one version (with other statistics the behaviour log-probs would
    not be those of the policy the learner evaluates)."""
    parameters = nn.utils.parameters_to_vector(actor.parameters()).detach().double()
    return torch.cat([parameters, torch.as_tensor(np.concatenate([obs_rms.mean, obs_rms.var, [obs_rms.count]]))])


def unpack_policy(weights, actor, obs_rms):
    """The inverse of `pack_policy`, into `actor` and `obs_rms`."""
    d = obs_rms.mean.shape[0]
    nn.utils.vector_to_parameters(weights[: -2 * d - 1].float(), actor.parameters())
    statistics = weights[-2 * d - 1 :].numpy().copy()  # a copy: `weights` views the next receive's buffer
    obs_rms.mean, obs_rms.var, obs_rms.count = statistics[:d], statistics[d:-1], float(statistics[-1])
# --8<-- [end:messages]


# --- Actors -------------------------------------------------------------------------------------

# --8<-- [start:run_actor]
def run_actor(rank, args, run_name, rng_state=None):
    """One actor: wait for the answer to its last segment (the first time: the initial policy),
    take the newer policy if one came, step the envs for a segment and send it; until told to stop.
    Every torch.distributed call of an actor is here. `rng_state`: where a resumed run's noise goes on."""
    num_envs = args.num_envs // args.num_actors
    envs = make_envs(replace(args, num_envs=num_envs, capture_video=args.capture_video and rank == 1), run_name)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give
    actor, obs_rms = Actor(obs_dim, act_dim).requires_grad_(False), RunningMeanStd(shape=(obs_dim,))
    generator = torch.Generator().manual_seed(args.seed + rank)  # actor 1: vaco_continuous.py's stream
    if rng_state is not None:
        generator.set_state(rng_state)
    layout = SegmentLayout(args.num_steps, num_envs, obs_dim, act_dim)
    message = torch.zeros(layout.size, dtype=torch.float64)
    segment = layout.views(message)
    reply = torch.zeros(2 + pack_policy(actor, obs_rms).numel(), dtype=torch.float64)  # the receive buffer

    # The synchronous script's envs, split across actors: env i of actor r has seed seed + (r-1)*n + i.
    raw_obs, _ = envs.reset(seed=args.seed + (rank - 1) * num_envs)
    version, wait_time, start = -1, 0.0, time.time()
    for index in itertools.count():
        waiting_since = time.time()
        dist.recv(reply, src=0, tag=REPLY_TAG)
        if reply[1] != CONTINUE:
            break
        if int(reply[0]) != version:  # a newer version: take its weights and statistics
            unpack_policy(reply[2:], actor, obs_rms)
        version = int(reply[0])
        wait_time += time.time() - waiting_since
        if index == 0:  # the reset's observations count in the statistics (here: those the first reply brought)
            segment["reset_obs"][:] = raw_obs
            obs_rms.update(raw_obs)
            current_obs = normalize_obs(raw_obs, obs_rms)
        current_obs = collect_rollout(envs, actor, obs_rms, current_obs, segment, generator)
        segment["rank"][:], segment["index"][:], segment["version"][:] = rank, index, version
        segment["wait_time"][:], segment["run_time"][:] = wait_time, time.time() - start
        segment["rng_state"][:] = generator.get_state().numpy()
        time.sleep(rank * args.actor_delay_ms / 1000)  # --actor-delay-ms: stragglers on demand
        waiting_since = time.time()
        dist.send(message, dst=0, tag=SEGMENT_TAG)  # returns once the learner has taken it
        wait_time += time.time() - waiting_since
    envs.close()
    if reply[1] == DISMISSED:
        print(f"actor {rank}: the learner counted this actor lost and carries on without it", file=sys.stderr)
# --8<-- [end:run_actor]


def actor_process(rank, world_size, args, port=None):
    """An actor process, started by torchrun or spawned by the learner (`port`: its store on
    127.0.0.1): exits 0 when the learner stops or dismisses it, 1 when the learner is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole terminal: the learner decides
    if port is not None:  # spawned: the learner is its parent process, whose end it sees at once, at any stage
        # the task's module first: importing gymnasium's MuJoCo envs runs a probe process (glfw's) for a moment, and
        # an actor leaving while it ran would leave it to print a traceback after the actor's one line
        gym.envs.registration.load_env_creator(gym.spec(args.env_id).entry_point)
        threading.Thread(target=watch_learner, args=(rank,), name="learner-watch", daemon=True).start()
    timeout = process_group_timeout(args)
    try:
        store = None if port is None else dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        # the learner's run name and settings (so message sizes agree whatever each node's command line
        # said), and a resumed run's noise generator, from the learner itself (`hand_out_settings`)
        startup = [None, None, None]
        dist.recv_object_list(startup, src=0)
        run_name, learner_args, rng_state = startup
        run_actor(rank, Args(**learner_args), run_name, rng_state)
        dist.destroy_process_group()
    except RuntimeError as e:  # gloo's, when the learner is gone: "Connection closed by peer", a timeout
        gone = port is not None and learner_gone(rank, timeout=1.0)  # spawned: the learner's end, if that was it
        leave(1, gone or f"error: actor {rank} stopped: {str(e).splitlines()[0]}")
    leave(0)  # its envs are closed and its group destroyed: nothing is left to save


def watch_learner(rank):
    """A spawned actor's thread: waits for its parent, the learner, to end (killed, say), then ends the actor with
    one line, whatever it was doing: starting up, joining the group, acting or waiting for a reply. Without it an
    actor whose learner died before the group formed would wait out gloo's timeout, 10 minutes and more."""
    leave(1, learner_gone(rank, timeout=None))


def learner_gone(rank, timeout):
    """The line a spawned actor leaves with once its learner has ended, waited for up to `timeout` s (None: as long
    as it takes), or None while the learner runs. Its sentinel is a pipe the learner holds open until it ends."""
    learner = mp.parent_process()
    learner.join(timeout)
    return None if learner.is_alive() else f"error: actor {rank} stopped: its learner (process {learner.pid}) is gone"


LEAVING = threading.Lock()  # held by the thread that ends an actor


def leave(code, line=None):
    """End this actor process with `code`, after `line` (on stderr): one line, whichever of its threads (the
    actor's own, `watch_learner`) comes first; the other waits here until the process is gone. No Python teardown:
    torch's would hold the learner, which waits for every actor to exit, for a second or more."""
    with LEAVING:
        sys.stdout.flush()
        sys.stderr.flush()
        if line:  # one write: the actors share the terminal, and a pipe keeps a short write whole, never interleaved
            os.write(sys.stderr.fileno(), f"{line}\n".encode())
        os._exit(code)


# --- Learner ------------------------------------------------------------------------------------

# --8<-- [start:learner_comm]
class LearnerComm(threading.Thread):
    """The learner's communication thread, the one place that knows which actors are alive and,
    until the run stops, the learner's only caller of torch.distributed (`Work.wait` releases the
    GIL, so training goes on meanwhile). It receives segments from any actor, queues them for the
    training loop and answers each one once, with [version, code, the weights of that version] (the
    actor takes them if its version is older). A full queue delays the answer, so the actor waits:
    backpressure that bounds the lag. With `sync` it answers once every live actor's segment is in
    and the version trained on them is published.

    gloo work cannot be polled and a timed-out `wait` closes every connection, so liveness is our
    own: an actor that owes us a segment (we answered it) and stays silent for --actor-timeout s of
    *listening* is lost. The listening clock stops while this thread blocks on the full queue or
    waits for a version (no segment can arrive then): a long update never makes actors look silent."""

    def __init__(self, actors, layout, queue_size, sync, version, weights):
        super().__init__(name="learner-comm", daemon=True)  # daemon: a receive that never returns cannot hold the exit
        self.actors, self.layout, self.sync = list(actors), layout, sync
        self.segments = queue.Queue(maxsize=queue_size)
        self.lock = threading.Condition(threading.RLock())  # guards the state below; notified on publish and stop
        self.published, self.replied_version = (version, weights), version
        self.pending = {actor: [] for actor in self.actors}  # reply sends not waited on yet (each waited by one thread)
        self.deaf_time, self.deaf_since = 0.0, None  # time not listening: finished periods, the current one's start
        self.unanswered = set(self.actors)  # actors waiting for our answer (at first, for the initial policy)
        self.last_contact = dict.fromkeys(self.actors, self.listening())  # on the listening clock
        self.lost, self.reported = {}, set()  # rank -> why it was counted lost; the losses `watch` returned
        self.stopped, self.told = set(), set()  # the actors answered STOP or DISMISSED; those whose answer was sent
        self.received, self.stopping, self.error = 0, False, None

    def listening(self):
        """The listening clock: seconds this thread has been able to receive (now - time deaf)."""
        with self.lock:
            now = time.monotonic()
            return now - self.deaf_time - (now - self.deaf_since if self.deaf_since is not None else 0.0)

    def not_listening(self, wait):
        """Run `wait()`, which blocks without receiving, with the listening clock stopped."""
        with self.lock:
            self.deaf_since = time.monotonic()
        try:
            return wait()
        finally:
            with self.lock:
                self.deaf_time, self.deaf_since = self.deaf_time + time.monotonic() - self.deaf_since, None

    def live(self):
        with self.lock:
            return [actor for actor in self.actors if actor not in self.lost and actor not in self.stopped]

    def watch(self, processes, timeout):
        """Count actors lost: their process exited (local launch), or they owe us a segment and were
        silent for `timeout` s of listening. Returns the losses not returned before {rank: why},
        those this thread found (a send that failed) too."""
        clock = self.listening()
        exited = {actor: f"its process exited with code {process.exitcode}"
                  for actor, process in processes.items() if process.exitcode is not None}
        with self.lock:
            for actor in self.live():
                if actor in exited:
                    self.lost[actor] = exited[actor]
                elif actor not in self.unanswered and clock - self.last_contact[actor] > timeout:
                    self.lost[actor] = f"silent for more than --actor-timeout {timeout:g} s"
            # the exit says more than the closed connection a send to that actor may have met first
            new = {actor: exited.get(actor, why) for actor, why in self.lost.items() if actor not in self.reported}
            self.lost.update(new)
            self.reported.update(new)
        return new

    def publish(self, version, weights):
        """Swap in a new version (a new tensor: a send may still read the old one)."""
        with self.lock:
            self.published = (version, weights)
            self.lock.notify_all()

    def stop(self):
        """Make every live actor's next answer STOP, and answer now those waiting for one (called by
        the training loop: under --sync this thread may be blocked in a receive no actor will complete)."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
            waiting = sorted(self.unanswered)
        for actor in waiting:
            self.reply(actor)

    def run(self):
        try:
            for actor in self.actors:  # the initial (or resumed) policy
                self.reply(actor)
            # Two receives from any actor always posted: a dead actor's closing connection then fails
            # one of them, once. (Detected while none is posted, it would fail every later one.)
            posted, failures = collections.deque(self.post() for _ in range(2)), 0
            while self.live():
                message, work = posted.popleft()
                try:
                    work.wait()
                    failures = 0
                except RuntimeError:  # that dead actor's connection: the others carry on
                    failures, message = failures + 1, None
                    if failures > 2 * len(self.actors):  # more than dead connections can explain: the group is broken
                        raise
                posted.append(self.post())
                if message is not None:
                    self.receive(message)
            self.wait_told()
        except Exception as e:  # the group is unusable: the training loop stops
            self.error = e

    def wait_told(self):
        """Let the STOP and DISMISSED sends finish before the group goes; not those of an answer still
        being sent by the other thread (each send is waited on once: gloo's second wait blocks)."""
        with self.lock:
            sends = [work for actor in self.told for work in self.pending.pop(actor, [])]
        for work in sends:
            work.wait()

    def post(self):
        message = torch.empty(self.layout.size, dtype=torch.float64)  # a new tensor per segment: the queue keeps it
        return message, dist.irecv(message, src=None, tag=SEGMENT_TAG)

    def receive(self, message):
        actor = int(message[0])  # the segment's first field: the sender's rank
        with self.lock:
            self.received += 1
            self.last_contact[actor] = self.listening()
            self.unanswered.add(actor)
            queue_it = not (self.stopping or actor in self.lost)
        queued = queue_it and self.not_listening(lambda: self.put(message))
        if not queued or not self.sync:
            self.reply(actor)  # CONTINUE, or STOP (the run is over), or DISMISSED (it was counted lost)
            return
        with self.lock:  # --sync: once every live actor's segment is in, answer them with the next version
            if not self.unanswered >= set(self.live()):
                return
            self.not_listening(lambda: self.lock.wait_for(
                lambda: self.published[0] > self.replied_version or self.stopping))
            waiting = sorted(self.unanswered)
        for actor in waiting:
            self.reply(actor)

    def put(self, message):
        """Queue a segment, blocking while the queue is full; False if the run stops meanwhile."""
        while not self.stopping:
            try:
                return self.segments.put(message, timeout=0.1) or True
            except queue.Full:
                pass
        return False

    def reply(self, actor):
        """Answer `actor`, if it waits for an answer: [version, code, weights]."""
        with self.lock:
            if actor not in self.unanswered:  # the other thread answered it (a stop)
                return
            self.unanswered.discard(actor)
            version, weights = self.published
            code = DISMISSED if actor in self.lost else STOP if self.stopping else CONTINUE
            self.last_contact[actor] = self.listening()  # its silence counts from now
            self.replied_version = version
            if code != CONTINUE:
                self.stopped.add(actor)
            previous, self.pending[actor] = self.pending[actor], []  # waited on once: a second gloo wait blocks
        try:
            for work in previous:  # it has sent a segment since, so it received these
                work.wait()
            sends = [dist.isend(torch.cat([torch.tensor([version, code], dtype=torch.float64), weights]), actor,
                                tag=REPLY_TAG)]
        except RuntimeError as e:  # its connection is gone: the process died
            with self.lock:
                self.lost.setdefault(actor, f"connection lost ({str(e).splitlines()[0]})")
            return
        with self.lock:
            self.pending[actor] = sends
            if code != CONTINUE:
                self.told.add(actor)
# --8<-- [end:learner_comm]


# --8<-- [start:take_batch]
def take_batch(comm, num_segments, max_lag, version, should_stop):
    """Segments from the queue until `num_segments` of them are at most `max_lag` versions old
    (older ones come too: they count in the statistics, not the batch), in actor order, so that a
    --sync batch is processed alike in every run. Returns (all segments taken, the batch, None), or
    (None, None, why) as soon as `should_stop()`, asked every 0.1 s while waiting, gives a reason."""
    segments, batch = [], []
    while len(batch) < num_segments:
        if why := should_stop():
            return None, None, why
        try:
            segments.append(comm.layout.views(comm.segments.get(timeout=0.1)))
        except queue.Empty:
            continue
        if max_lag is None or version - segments[-1]["version"][0] <= max_lag:
            batch.append(segments[-1])
    in_actor_order = functools.partial(sorted, key=lambda segment: (segment["rank"][0], segment["index"][0]))
    return in_actor_order(segments), in_actor_order(batch), None


def absorb_segment(segment, reward_scaler, obs_rms, rng_states, actor_stats):
    """What the learner does with every segment it takes, used or not: scale the rewards with its
    one set of return statistics (each env in step order), fold the observations the actor saw into
    the learner's statistics in the actor's order (with one actor, they are the actor's bit for bit),
    note the actor's noise generator in `rng_states` and its steps and waiting in `actor_stats`.
    Returns the episodes that ended in it: (return, length, step of the segment)."""
    actor, dones = int(segment["rank"][0]), segment["dones"] > 0
    envs = slice((actor - 1) * dones.shape[1], actor * dones.shape[1])  # this actor's share of all envs
    for step in range(dones.shape[0]):
        segment["rewards"][step] = reward_scaler(segment["rewards"][step], dones[step], envs)
    if segment["index"][0] == 0:  # its envs were just reset: their first observations count too
        obs_rms.update(segment["reset_obs"])
    for raw_obs in segment["raw_obs"]:
        obs_rms.update(raw_obs)
    rng_states[actor] = torch.as_tensor(segment["rng_state"], dtype=torch.uint8)
    stats = actor_stats.setdefault(actor, dict(steps=0))
    stats["steps"] += dones.size
    stats["wait_fraction"] = segment["wait_time"][0] / max(segment["run_time"][0], 1e-9)
    ended = np.nonzero(segment["episode_lengths"] > 0)  # (steps, envs), in step order
    return list(zip(segment["episode_returns"][ended].tolist(), segment["episode_lengths"][ended].tolist(),
                    ended[0].tolist()))
# --8<-- [end:take_batch]


def actor_wait_fraction(actor_stats):
    """The share of their time the actors spent waiting on the learner, on average."""
    return float(np.mean([stats["wait_fraction"] for stats in actor_stats.values()] or [0.0]))


def log_actors(writer, step, elapsed, comm, actor_stats, **charts):
    """The machinery, per update: how the queue and the actors fare, who waits for whom (a learner
    that waits for data wants more actors), with the training loop's own `charts`."""
    charts.update(queue_depth=comm.segments.qsize(), actors_alive=len(comm.live()),
                  actor_wait_fraction=actor_wait_fraction(actor_stats))
    for name, value in charts.items():
        writer.add_scalar(f"charts/{name}", value, step)
    for actor, stats in actor_stats.items():
        writer.add_scalar(f"actors/actor_{actor}_SPS", stats["steps"] / elapsed, step)
        writer.add_scalar(f"actors/actor_{actor}_wait_fraction", stats["wait_fraction"], step)


# --- Launch -------------------------------------------------------------------------------------

# --8<-- [start:resolve_launch]
def resolve_launch(args):
    """(rank, world size, started by torchrun?). Fills in args.num_actors."""
    if not dist.is_torchelastic_launched():  # a local launch: this process learns and spawns the actors
        args.num_actors = 1 if args.num_actors is None else args.num_actors
        return 0, args.num_actors + 1, False
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])  # set by torchrun
    if world_size < 2:
        sys.exit("error: torchrun started 1 process; the learner needs at least 1 actor (--nproc-per-node 2 or more)")
    if args.num_actors not in (None, world_size - 1):
        sys.exit(f"error: torchrun started {world_size} processes, but --num-actors {args.num_actors} "
                 f"needs {args.num_actors + 1} (a learner and the actors)")
    args.num_actors = world_size - 1
    return rank, world_size, True
# --8<-- [end:resolve_launch]


def process_group_timeout(args):
    """gloo applies it to every wait, and a wait that times out closes every connection of the
    group; so it must exceed any quiet time of a healthy run (liveness is our own protocol)."""
    return datetime.timedelta(seconds=max(600.0, 2 * args.actor_timeout))


def open_store(args, world_size):
    """Local launch: the learner's rendezvous store on 127.0.0.1, opened before anything is written."""
    try:
        return dist.TCPStore("127.0.0.1", args.master_port, world_size, is_master=True,
                             timeout=process_group_timeout(args), wait_for_workers=False)
    except dist.DistNetworkError as e:
        why = "the port is in use" if "EADDRINUSE" in str(e) else str(e).splitlines()[0]
        sys.exit(f"error: cannot listen on 127.0.0.1:{args.master_port}: {why} "
                 "(choose another --master-port, or 0 for any free one)")


def launch(args, world_size, store, processes, run_name, rng_states):
    """The learner's process group, which waits for every actor: torchrun's rendezvous (`store`
    None), or here the actor processes it starts with spawn (a fresh interpreter: nothing is forked
    from this one) into `processes`, an actor that dies first ending the launch; then the actors
    take the learner's settings (`actor_process`)."""
    if store is not None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited: a Ctrl-C cannot hit their start-up
        for rank in range(1, world_size):
            processes[rank] = mp.get_context("spawn").Process(target=actor_process, daemon=True,
                                                              args=(rank, world_size, args, store.port))
            processes[rank].start()
        signal.signal(signal.SIGINT, previous)
    joined = threading.Event()

    def watchdog():
        while not joined.wait(0.2):
            if dead := [(rank, p.exitcode) for rank, p in processes.items() if p.exitcode is not None]:
                print(f"error: actor {dead[0][0]} exited during start-up (code {dead[0][1]})", file=sys.stderr,
                      flush=True)
                for process in processes.values():
                    process.kill()
                os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    group = {} if store is None else dict(store=store, rank=0, world_size=world_size)  # torchrun's: in the environment
    dist.init_process_group("gloo", timeout=process_group_timeout(args), **group)
    hand_out_settings(world_size, run_name, args, rng_states)
    joined.set()
    print(f"learner: {world_size - 1} actor(s) joined", flush=True)


def hand_out_settings(world_size, run_name, args, rng_states):
    """Each actor's start-up message, sent by the learner to that actor alone: an actor never depends
    on another. (A collective would not do: gloo's broadcast relays along a tree of ranks, so an actor
    killed just after taking its own message would take down the actors it is to relay to.) Each send
    returns once the actor has taken its message."""
    for rank in range(1, world_size):
        try:  # the options alone, not the sizes main computes
            options = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
            dist.send_object_list([run_name, options, rng_states.get(rank)], dst=rank)
        except RuntimeError as error:  # gloo's "Connection closed by peer": it died before taking it
            sys.exit(f"error: actor {rank} was lost during start-up: {str(error).splitlines()[0]}")


def shut_down(comm, processes, args):
    """Tell every live actor STOP (now, if it waits for an answer, else at its next segment) and
    give them --actor-timeout s to take it, then 10 s to exit; no actor process outlives the
    learner. True if the communication thread has ended (then the group can go)."""
    comm.stop()
    deadline = time.time() + args.actor_timeout
    while comm.is_alive() and comm.live() and time.time() < deadline:
        comm.watch(processes, args.actor_timeout)  # one that dies now need not be waited for
        comm.join(0.1)
    deadline = time.time() + 10
    for rank, process in processes.items():  # those told to stop get 10 s to exit, the others none
        process.join(max(0.0, deadline - time.time()) if rank in comm.told else 0)
        if process.is_alive():
            if rank in comm.told:
                print(f"actor {rank} did not exit within 10 s of being told to stop: killed", file=sys.stderr)
            process.kill()
            process.join()
    comm.join(1.0)  # the stopped actors' closed connections end its last receive
    if not comm.is_alive():  # every receive and send is done
        dist.destroy_process_group()
    return not comm.is_alive()


def main(args: Args):
    rank, world_size, torchrun = resolve_launch(args)
    if rank > 0:  # torchrun started this process as an actor: it takes the learner's settings (and exits)
        actor_process(rank, world_size, args)
    checkpoint = check_args(args)  # before anything runs: the options, and the checkpoint of --resume
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"

    # env setup (checked before any process starts or any log is written); the actors step the envs
    envs = make_envs(replace(args, num_envs=1, capture_video=False), run_name)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    envs.close()

    torch.manual_seed(args.seed)  # the networks' initial weights
    torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order
    rng_states, actor_stats = {}, {}  # per actor: its noise generator after its last segment; its steps and waiting

    agent = Agent(obs_dim, act_dim)
    params = {name: p.detach() for name, p in agent.named_parameters()}  # views: updating them updates the agent
    adam = adam_state(params)
    lr = torch.tensor(args.learning_rate)
    update = compiled_or_eager(train_step, args.compile)
    obs_rms = RunningMeanStd(shape=(obs_dim,))
    reward_scaler = RewardScaler(args.num_envs, args.gamma)  # all envs; each actor's are a slice
    # what a checkpoint holds, and --resume restores
    saved = dict(agent=agent, optimizer=adam, obs_rms=obs_rms, reward_rms=reward_scaler.return_rms,
                 generator=generator, actor_generators=rng_states)
    global_step, start_iteration, num_iterations = resume(checkpoint, saved, args)  # 0, 1, args.num_iterations new
    store = None if torchrun else open_store(args, world_size)  # where the actors will find the learner
    writer = open_logs(args, run_name)  # after every check: a run that exits early leaves no logs

    # --8<-- [start:launch]
    # Launch; from here on, point-to-point messages only.
    processes = {}  # rank -> its actor process, in a local launch
    stop = LearnerStop(processes)  # Ctrl-C, SIGTERM: the update under way ends, a checkpoint; a second kills the actors
    launch(args, world_size, store, processes, run_name, rng_states)
    version = start_iteration - 1  # the policy version: the number of updates so far
    layout = SegmentLayout(args.num_steps, args.num_envs // args.num_actors, obs_dim, act_dim)  # each actor's segment
    comm = LearnerComm(range(1, world_size), layout, args.queue_batches * args.num_actors, args.sync, version,
                       pack_policy(agent.actor, obs_rms))
    comm.start()
    # --8<-- [end:launch]
    recent_returns = collections.deque(maxlen=100)
    used = dropped = learner_wait = 0
    progress = Progress(global_step, global_step + (num_iterations - start_iteration + 1) * args.batch_size)

    for iteration in range(start_iteration, num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            lr.fill_(frac * args.learning_rate)

        # --8<-- [start:batch]
        # The batch: num_actors segments (num_envs x num_steps transitions) from whichever actors
        # sent them first. A segment's lag: the learner's version now - the version that acted.
        waiting_since = time.perf_counter()
        segments, batch, stopped = take_batch(comm, args.num_actors, args.max_policy_lag, version,
                                              lambda: stop.now(comm, args))
        learner_wait += time.perf_counter() - waiting_since
        if stopped:
            break
        episodes = []
        for segment in segments:
            episodes += absorb_segment(segment, reward_scaler, obs_rms, rng_states, actor_stats)
        for ret, length, step in episodes:
            recent_returns.append(ret)
            ended_at = global_step + (step + 1) * args.num_envs  # logged at the env step that ended it
            writer.add_scalar("charts/episodic_return", ret, ended_at)
            writer.add_scalar("charts/episodic_length", length, ended_at)
        lags = [version - int(segment["version"][0]) for segment in batch]  # the others are dropped: too old
        writer.add_scalar("charts/policy_lag_mean", np.mean(lags), global_step)
        writer.add_scalar("charts/policy_lag_max", max(lags), global_step)
        writer.add_histogram("charts/policy_lag", np.array(lags), global_step)
        global_step, used, dropped = global_step + args.batch_size, used + len(batch), dropped + len(segments) - len(batch)

        # Segments side by side: [T, n, ...] each -> [T, N, ...]
        b = {key: torch.as_tensor(np.concatenate([segment[key] for segment in batch], axis=1), dtype=torch.float32)
             for key in ("obs", "next_obs", "actions", "behaviour_logprobs", "rewards", "terminations", "dones")}
        # --8<-- [end:batch]
        b.update(estimate_advantages(agent, b, args))
        # Backward lag, before any step: the weights w = pi_T/beta, how far the learner is from the behaviour policies
        weight = (b["proximal_logprobs"] - b["behaviour_logprobs"]).exp()
        writer.add_scalar("charts/backward_tv", 0.5 * (weight - 1).abs().mean().item(), global_step)
        writer.add_scalar("charts/backward_ratio_mean", weight.mean().item(), global_step)
        writer.add_scalar("charts/backward_ratio_max", weight.max().item(), global_step)
        writer.add_scalar("charts/rho_clipped_fraction", (weight > args.rho_bar).float().mean().item(), global_step)

        # flatten what the minibatches read: [T, N, ...] -> [T * N, ...]
        flat = {key: b[key].reshape(args.batch_size, *b[key].shape[2:]) for key in
                ("obs", "actions", "behaviour_logprobs", "proximal_logprobs", "advantages", "returns", "values")}

        # Optimizing the policy and value network
        stats = collections.defaultdict(list)
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, generator=generator)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                for name, value in update(params, adam, flat, mb_inds, lr, agent, args).items():
                    stats[name].append(value)

            if args.target_kl is not None and stats["approx_kl"][-1] > args.target_kl:
                break

        # The actors pick up the new policy: the next version, with the statistics that include this batch.
        # The segments received are counted before they hear of it: under --sync, then, exactly those taken.
        received = comm.received
        version += 1
        stopping = stop.after(iteration, stats, params)  # a signal came, or a loss or weight is no longer finite
        if not stopping:  # (weights that are not finite never reach an actor)
            comm.publish(version, pack_policy(agent.actor, obs_rms))

        sps = progress.update(global_step, recent_returns, lag=np.mean(lags), last=iteration == num_iterations)
        elapsed = time.time() - progress.start_time
        writer.add_scalar("charts/learning_rate", lr.item(), global_step)
        for name, values_list in stats.items():  # means over all minibatches of the update
            writer.add_scalar(f"losses/{name}", torch.stack(values_list).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_variance(b["values"], b["returns"]), global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        log_actors(writer, global_step, elapsed, comm, actor_stats, segments_received=received, segments_used=used,
                   segments_dropped=dropped, updates_per_second=(iteration - start_iteration + 1) / elapsed,
                   learner_wait_fraction=learner_wait / elapsed)
        if stopping:
            break
        if args.save_model and args.checkpoint_every and iteration % args.checkpoint_every == 0 \
                and iteration < num_iterations:
            save_checkpoint(f"runs/{run_name}/{args.exp_name}_step{global_step}.cleanrl_model",
                            checkpoint_of(saved, global_step, iteration, args))

    print(f"segments: {used} used, {dropped} dropped, {comm.received} received | waiting: learner {learner_wait / (time.time() - progress.start_time):.0%}"
          f" of its time (for data), actors {actor_wait_fraction(actor_stats):.0%} (for the learner)", flush=True)
    finish(args, saved, run_name, global_step, version, writer, stop, lambda: shut_down(comm, processes, args))


# ==================================== run management ====================================
# Input checks, compile or not, checkpoints, resume, evaluation, logs, progress: main calls each in one line.


def check_args(args: Args):
    """Reject bad input with one line that names the problem (raised as SystemExit: no traceback). Returns the
    checkpoint of --resume (or None), once the run is shown to keep the settings it was trained with."""
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    sitting = {"total_timesteps", "exp_name", "track", "wandb_project_name", "wandb_entity", "capture_video",
               "save_model", "eval_episodes", "checkpoint_every", "resume", "compile", "num_envs", "num_steps",
               "num_minibatches", "num_actors", "master_port", "actor_timeout", "stop_on_actor_loss"}
    # what a resumed run may change: its length, name, logs, checkpoints and layout (of envs and actors), where it
    # listens and how it meets faults; not the lag's settings (--sync, --queue-batches, --max-policy-lag,
    # --actor-delay-ms), which change the data it trains on
    for name, value in checkpoint["args"].items() if checkpoint else ():
        if name not in sitting and getattr(args, name) != value:
            sys.exit(f"error: --{name.replace('_', '-')} {getattr(args, name)} differs from {value}, the value "
                     f"{args.resume} was trained with: a resumed run keeps its own settings (leave the option out)")
    ranges = dict(  # every numeric option: the interval of values it takes
        total_timesteps="[1, inf)", num_envs="[1, inf)", num_steps="[1, inf)", num_minibatches="[1, inf)",
        update_epochs="[1, inf)", learning_rate="(0, inf)", max_grad_norm="(0, inf)",
        clip_coef="(0, inf)", target_kl="(0, inf)", gamma="[0, 1]", gae_lambda="[0, 1]", ent_coef="[0, inf)",
        vf_coef="[0, inf)", eval_episodes="[0, inf)", checkpoint_every="[0, inf)", seed="[0, 4294967295]",
        tv_threshold="(0, inf)", rho_bar="(0, inf)", c_bar="(0, inf)", num_actors="[1, inf)",
        queue_batches="[1, inf)", max_policy_lag="[0, inf)", actor_delay_ms="[0, inf)", actor_timeout="(0, inf)",
        master_port="[0, 65535]")
    for name, interval in ranges.items():  # "[" and "]" include their bound, "(" and ")" leave it out
        value, (low, high) = getattr(args, name), map(float, interval[1:-1].split(","))
        if value is not None and not (low < value < high or value == low and interval[0] == "["
                                      or value == high and interval[-1] == "]"):
            sys.exit(f"error: --{name.replace('_', '-')} must be in {interval}, got {value}")
    if args.num_envs % args.num_actors:
        sys.exit(f"error: --num-envs {args.num_envs} cannot be split evenly across {args.num_actors} actors")
    batch_size, done = args.num_envs * args.num_steps, checkpoint["global_step"] if checkpoint else 0
    if batch_size % args.num_minibatches:
        sys.exit(f"error: the batch of {args.num_envs} envs x {args.num_steps} steps = {batch_size} "
                 f"is not divisible by --num-minibatches {args.num_minibatches}")
    if args.norm_adv and batch_size // args.num_minibatches < 2:  # the std of one sample
        sys.exit("error: a minibatch of 1 sample cannot normalise its advantages; lower --num-minibatches")
    if args.total_timesteps - done < batch_size:
        sys.exit(f"error: --total-timesteps {args.total_timesteps} leaves less than a batch ({batch_size}) to train"
                 + (f" after the checkpoint's step {done}: raise it to train on" if checkpoint else ""))
    if (args.total_timesteps - done) % batch_size:  # whole batches only
        print(f"note: the run trains to step {done + (args.total_timesteps - done) // batch_size * batch_size}, the "
              f"last whole batch of {batch_size} within --total-timesteps {args.total_timesteps}", flush=True)
    if args.exp_name in ("", ".", "..") or os.sep in args.exp_name:
        sys.exit(f"error: --exp-name names the run's folder: a plain name, not '{args.exp_name}'")
    if tuple(map(int, gym.__version__.split(".")[:2])) < (1, 4):  # earlier vector RecordEpisodeStatistics
        sys.exit(f"error: gymnasium {gym.__version__} drops the first reward of every episode after an env's "
                 "first from the logged returns; pip install 'gymnasium>=1.4'")
    if args.clip_reference == "proximal" and args.tv_filter:
        sys.exit("error: --clip-reference proximal centres the clip of the --no-tv-filter ablation; add --no-tv-filter")
    if args.env_id not in gym.registry:
        close = difflib.get_close_matches(args.env_id, list(gym.registry), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        sys.exit(f"error: unknown environment id '{args.env_id}'{hint}")
    try:  # the env's module: a missing optional package (Box2D) is one line, not a traceback at the first reset
        gym.envs.registration.load_env_creator(gym.spec(args.env_id).entry_point)
    except gym.error.DependencyNotInstalled as error:
        sys.exit(f"error: {args.env_id} needs a package that is not installed: {str(error).splitlines()[0]}")
    return checkpoint


def compiled_or_eager(step, enabled):
    """`step` compiled into one program by torch.compile (at its first call), or `step` itself: with `enabled` False,
    or where a tiny program does not compile here (no C++ compiler, say), which one line says."""
    if not enabled:
        return step
    try:
        torch.compile(lambda x: x + 1, fullgraph=True)(torch.zeros(2))
    except torch._dynamo.exc.BackendCompilerFailed as error:
        inner = f"{type(error.inner_exception).__name__}: {error.inner_exception}".splitlines()[0][:200]
        print(f"note: torch.compile failed ({inner}); the update runs eagerly", flush=True)
        return step
    print("compiling the update step at the first update (--no-compile skips this)", flush=True)
    return torch.compile(step, fullgraph=True)


def save_checkpoint(path, checkpoint):
    """`checkpoint` holds tensors and plain numbers only. Written to a temporary file, then renamed: a save that
    fails (a full disk) leaves no half-written file, nor a checkpoint overwritten, and is one line."""
    try:
        torch.save(checkpoint, path + ".tmp")
        os.replace(path + ".tmp", path)
    except (OSError, RuntimeError) as error:  # RuntimeError: torch's archive writer, on a full disk
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
        sys.exit(f"error: could not save the checkpoint {path}: {str(error).splitlines()[0]}")
    print(f"model saved to {path}", flush=True)


def load_checkpoint(path):
    """A checkpoint of this script, loaded with weights_only=True: loading never runs code. Anything else is one line:
    no file, an empty, cut short or foreign one, another script's checkpoint, one that lacks a part."""
    script = os.path.basename(__file__)
    if not zipfile.is_zipfile(path):  # what torch.save writes
        sys.exit(f"error: {path}: " + ("not a checkpoint" if os.path.exists(path) else "no such file"))
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        sys.exit(f"error: refusing to load {path}: it holds more than tensors and plain values "
                 "(a pickled object, which could run code)")
    except RuntimeError as error:  # an archive that torch cannot read: another program's, or one cut short
        sys.exit(f"error: {path}: not a checkpoint ({str(error).splitlines()[0]})")
    saved_by = checkpoint.get("script") if isinstance(checkpoint, dict) else None
    if saved_by != script:
        sys.exit(f"error: {path}: not a checkpoint of {script}" + (f" but of {saved_by}" if saved_by else ""))
    missing = [part for part in ("args", "global_step", "iteration", "agent", "optimizer", "obs_rms", "reward_rms",
                                 "generator", "actor_generators") if part not in checkpoint]
    if missing:
        sys.exit(f"error: {path}: a checkpoint of {script} without its {', '.join(missing)}")
    return checkpoint


def checkpoint_of(saved, global_step, iteration, args):
    """Everything a resumed run needs, of the objects in `saved`, as tensors and plain numbers."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    return {"script": os.path.basename(__file__), "args": options, "global_step": global_step, "iteration": iteration,
            "agent": saved["agent"].state_dict(), "optimizer": saved["optimizer"],
            "obs_rms": rms_state(saved["obs_rms"]), "reward_rms": rms_state(saved["reward_rms"]),
            "generator": saved["generator"].get_state(), "actor_generators": saved["actor_generators"]}


def resume(checkpoint, saved, args):
    """Load the checkpoint of --resume (check_args's) into the objects in `saved`. Returns the step and the update to
    go on from, and the last update: a resumed run trains the whole batches that fit in what is left of the budget
    (its batch size may differ). Without a checkpoint: 0, 1 and args.num_iterations."""
    if checkpoint is None:
        return 0, 1, args.num_iterations
    global_step, iteration = checkpoint["global_step"], checkpoint["iteration"]
    saved["agent"].load_state_dict(checkpoint["agent"])
    adam = saved["optimizer"]  # saved with that agent, so it fits
    adam["step"].copy_(checkpoint["optimizer"]["step"])
    for moment in ("exp_avg", "exp_avg_sq"):
        for name, value in checkpoint["optimizer"][moment].items():
            adam[moment][name].copy_(value)
    load_rms_state(saved["obs_rms"], checkpoint["obs_rms"])
    load_rms_state(saved["reward_rms"], checkpoint["reward_rms"])
    saved["generator"].set_state(checkpoint["generator"])
    saved["actor_generators"].update(checkpoint["actor_generators"])  # each actor's noise, as of its last segment
    print(f"resumed from {args.resume} at step {global_step} (update {iteration})")
    return global_step, iteration + 1, iteration + (args.total_timesteps - global_step) // args.batch_size


def rms_state(rms):
    return {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": float(rms.count)}


def load_rms_state(rms, state):
    rms.mean, rms.var, rms.count = state["mean"].numpy(), state["var"].numpy(), state["count"]


@torch.inference_mode()
def evaluate(saved, args, writer):
    """--eval-episodes episodes of the trained policy, as saved (mean actions, frozen observation statistics),
    their returns logged as eval/episodic_return."""
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id))
    agent, obs_rms = saved["agent"], saved["obs_rms"]
    returns = []
    obs, _ = env.reset(seed=args.seed + 10_000)
    while len(returns) < args.eval_episodes:
        mean, _ = agent.actor(torch.as_tensor(normalize_obs(obs[None], obs_rms)))
        action = np.clip(mean[0].numpy(), env.action_space.low, env.action_space.high)
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            writer.add_scalar("eval/episodic_return", returns[-1], len(returns) - 1)
            obs, _ = env.reset()
    env.close()
    if returns:
        print(f"eval: mean return over {len(returns)} episodes = {np.mean(returns):.1f}")


def explained_variance(values, returns):
    """1 - Var(returns - values) / Var(returns): the share of the return targets' variance that the critic's
    values explain (1: all of it, 0: no better than their mean; NaN where the targets do not vary)."""
    y_pred, y_true = values.numpy().ravel(), returns.numpy().ravel()
    var_y = np.var(y_true)
    return np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y


def open_logs(args, run_name):
    """TensorBoard in runs/<run_name>, a folder never used before, mirrored to Weights & Biases with --track."""
    try:
        os.makedirs(f"runs/{run_name}")  # never mix two runs' logs or checkpoints
    except OSError as error:  # it exists, or runs/ is a file or read-only
        sys.exit(f"error: cannot make the run folder runs/{run_name}: {error.strerror}")
    print(f"run folder: runs/{run_name} (tensorboard --logdir runs). Below, return: the mean of the last 100 "
          "episodes; lag: how many updates behind the learner the actors' policies were, on average", flush=True)
    if args.track:
        import wandb

        wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                   config=vars(args), name=run_name, save_code=True)
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items()))
    return writer


class Stop:
    """Why the training loop ends early: Ctrl-C or SIGTERM (after the update under way, then `finish` saves; a second
    signal stops at once, unsaved), or a loss or weight that is no longer finite (checked once an update)."""

    def __init__(self):
        self.signal = self.diverged = None
        signal.signal(signal.SIGINT, self.request)
        signal.signal(signal.SIGTERM, self.request)

    def request(self, signum, frame):
        if self.signal:
            raise SystemExit(128 + signum)
        self.signal = signum
        print(f"\n{signal.Signals(signum).name}: stopping after this update (again: at once, unsaved)", flush=True)

    def after(self, iteration, stats, params):
        """True when the loop stops after this update; `diverged` then names what is not finite."""
        values = {name: torch.stack(v).mean() for name, v in stats.items()}
        values.update({f"weights {name}": p for name, p in params.items()})
        bad = [name for name, value in values.items() if not value.isfinite().all()]
        self.diverged = f"update {iteration} made the {bad[0]} NaN or infinite" if bad else None
        return bool(self.signal or bad)


class LearnerStop(Stop):
    """Stop, and what a learner with actors stops for besides: `fault`, why the machinery cannot go on (an actor lost
    under --sync or --stop-on-actor-loss, none left, the group broken; then `finish` saves and exits 1). A second
    signal also kills the actor processes it started (`processes`) and exits at once, with no teardown, which a
    receive that no actor will complete could hold."""

    def __init__(self, processes):
        super().__init__()
        self.processes, self.fault = processes, None

    def request(self, signum, frame):
        if self.signal:
            for process in self.processes.values():
                process.kill()
            os._exit(128 + signum)
        super().request(signum, frame)

    def now(self, comm, args):
        """True when the run must stop now, asked while the learner waits for data: a signal came, or a fault (which
        sets `fault`). Prints every actor lost, once."""
        lost = comm.watch(self.processes, args.actor_timeout)
        for actor, reason in lost.items():
            print(f"actor {actor} lost: {reason}", flush=True)
        if lost and (args.stop_on_actor_loss or args.sync):
            why = "--sync needs every actor" if args.sync else "--stop-on-actor-loss"
            self.fault = f"actor {min(lost)} lost ({why})"
        elif comm.error is not None and not self.signal:
            self.fault = f"communication failed: {str(comm.error).splitlines()[0]}"
        elif not comm.live() and not self.signal:
            self.fault = "no actor left"
        return bool(self.signal or self.fault)


def finish(args, saved, run_name, global_step, iteration, writer, stop, shut_down):
    """The end of a run: its checkpoint (with --save-model), its evaluation. After a signal, a checkpoint anyway, the
    command that resumes it and exit 130 (Ctrl-C) or 143 (SIGTERM); after a divergence, none (the earlier ones stay);
    after a fault, a checkpoint, why, and exit 1. The actors are told to stop (`shut_down`: True once the group is
    gone) after the checkpoint is saved, since under torchrun a SIGTERM is followed by a SIGKILL if the shutdown
    takes long."""
    path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
    if (args.save_model or stop.signal or stop.fault) and not stop.diverged:
        save_checkpoint(path, checkpoint_of(saved, global_step, iteration, args))
    ended = shut_down()
    if args.save_model and not (stop.signal or stop.fault or stop.diverged):
        evaluate(saved, args, writer)
    writer.close()
    if args.track:
        import wandb

        wandb.finish()
    resume, code = f"continue with: python {os.path.basename(__file__)} --resume {path}", 0
    if stop.diverged:
        print(f"error: {stop.diverged}: the run stopped (its checkpoints before it, if any: runs/{run_name})",
              file=sys.stderr)
        code = 1
    elif stop.fault:
        print(f"error: stopped at step {global_step}, update {iteration}: {stop.fault}; {resume}", file=sys.stderr)
        code = 1
    elif stop.signal:
        print(f"stopped at step {global_step}; {resume}")
        code = 128 + stop.signal
    sys.stdout.flush(), sys.stderr.flush()
    sys.exit(code) if ended else os._exit(code)  # a receive blocked on a silent actor must not hold the exit


class Progress:
    """The progress line, every 10 s from the second update and at the end: steps, steps per second since the start
    (SPS), the mean return of the last 100 episodes, the batch's mean policy lag, and the time left at the pace since
    the first update, which also compiled the update step."""

    def __init__(self, start_step, end_step):
        self.start_step, self.end_step, self.first = start_step, end_step, None
        self.start_time = self.last_print = time.time()

    def update(self, global_step, recent_returns, lag, last):
        """Print the line when it is due; returns the steps per second since the start."""
        now = time.time()
        sps = int((global_step - self.start_step) / (now - self.start_time))
        self.first = self.first or (global_step, now)  # the end of the first update
        if now - self.last_print > 10 and global_step > self.first[0] or last:
            self.last_print = now
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            left = int((self.end_step - global_step) * (now - self.first[1]) / max(global_step - self.first[0], 1))
            eta = f"{left // 3600}h{left % 3600 // 60:02d}m" if left >= 3600 else f"{left // 60}m{left % 60:02d}s"
            print(f"step {global_step}/{self.end_step} ({100 * global_step / self.end_step:.0f}%) | SPS: {sps} | "
                  f"return (last {len(recent_returns)} eps) {recent} | lag {lag:.2f} | ETA {eta}", flush=True)
        return sps


if __name__ == "__main__":
    args, torchrun = tyro.cli(Args), dist.is_torchelastic_launched()
    if args.resume and not (torchrun and os.environ["RANK"] != "0"):  # the learner: an actor takes its options
        saved = load_checkpoint(args.resume)["args"]
        saved["num_actors"] = None if torchrun else saved["num_actors"]  # under torchrun, its processes count them
        # a resumed run: the checkpoint's options are the defaults, so that one left out changes nothing
        args = tyro.cli(Args, default=Args(**saved))
    main(args)
