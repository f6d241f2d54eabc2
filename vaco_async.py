# VACO for continuous control (MuJoCo) with asynchronous actor processes and a learner on
# torch.distributed (gloo). Single file, CleanRL style. Docs: docs/vaco_async.md
"""VACO (total Variation-based Advantage aligned Constrained policy Optimization), arXiv 2603.01365,
whose actors are real processes that act with whatever weights they last received.

``vaco_continuous.py`` simulates policy lag with a buffer of policy snapshots; here the lag arises
as in a distributed system. Rank 0 is the learner, ranks 1..N are actors, and they talk only
through torch.distributed (gloo backend, CPU tensors, point-to-point after start-up):

    actors, ranks 1..N                               learner, rank 0
    num_envs/N envs each, acting with                comm thread, the one that calls torch.distributed:
    the newest policy version received               recv(src=None) -> bounded queue -> training loop:
                                                     num_actors segments = a batch -> VACO update ->
                                                     publish version + 1

    segment (num_steps steps)      -- isend ------>  queued; answered at once, or once the queue has
                                                     room (a full queue holds the actors back)
    next segment                   <-- reply ------  [version, stop], and if the actor's version is
                                                     older, its weights + observation statistics

Acting and learning overlap, so a segment can be several versions old when the learner uses it:
its lag = learner version at use - behaviour version (time in the queue included). VACO answers
that lag exactly as in ``vaco_continuous.py``:

1. Advantage alignment (backward lag: the learner pi_T already differs from the behaviour policy
   beta that acted). Once per update, before any gradient step, V-trace estimates the advantages
   of pi_T from beta's data, with clipped importance ratios; the critic regresses on V-trace targets.
2. TV filtering (forward lag: pi_theta drifts from beta over many minibatch steps). Per minibatch,
   TV(pi_theta, beta) ~ 1/2 mean|r - 1|, r = pi_theta/beta. Above a threshold delta, every sample
   whose update would increase the divergence (A and r - 1 of the same sign) has its gradient
   detached. No ratio clipping.

``diff vaco_continuous.py vaco_async.py`` shows the distributed machinery and nothing else.

    python vaco_async.py --env-id Ant-v4 --num-actors 2    # the learner and 2 actor processes, here
    python vaco_async.py --env-id Hopper-v4 --sync          # lag 0 by construction (the baseline)
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \\
        vaco_async.py --env-id Ant-v4 --num-envs 14         # rank 0 learns, the 7 others act
    tensorboard --logdir runs
"""

import collections
import datetime
import difflib
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
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
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment: with `--sync`, same seed, machine and flags give the same returns"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """run the learner's networks on CUDA if available; off because 64-unit MLPs run faster on the CPU"""
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
    """continue a run from a checkpoint it saved (weights, optimizer, normalisation, random stream,
    step count and version) up to `--total-timesteps`; the episodes in flight are not saved, so the
    actors start new ones. Logs go to a new run folder"""

    # Algorithm specific arguments
    env_id: str = "Hopper-v4"
    """the id of the environment (a MuJoCo task, v4 or v5)"""
    total_timesteps: int = 1000000
    """total timesteps of the experiments: env steps the learner takes from the actors, used or dropped"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments in total, split evenly across the actors"""
    num_steps: int = 256
    """the number of steps each env runs per segment (8 envs x 256 steps keeps CleanRL's batch of
    2048 transitions: every update consumes num_actors segments, 2048 transitions in all)"""
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
    """the surrogate clipping coefficient (used only by the `--no-tv-filter` ablation)"""
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
    """delta: filter samples once the minibatch's TV(pi_theta, reference) exceeds it. 0.1 with the
    behaviour reference won the lag study's sweep (delta 0.05/0.1/0.2 x both references, Hopper and
    HalfCheetah, K 1 and 8, 3 seeds; 1M-step finalists): docs/results.md"""
    tv_reference: Literal["behaviour", "proximal"] = "behaviour"
    """the policy the TV filter measures against. behaviour: beta, the paper's rule (the TV then
    holds backward and forward lag together); proximal: pi_T, the learner's policy at the start of
    the update (Hilton et al. 2021), so the filter bounds only the forward drift while alignment
    handles the backward lag. The surrogate's ratio stays pi_theta/beta either way; K = 1: equal"""
    rho_bar: float = 1.0
    """V-trace: clip of the importance ratios in the TD errors (rho-bar)"""
    c_bar: float = 1.0
    """V-trace: clip of the importance ratios in the trace (c-bar)"""
    advantage_alignment: bool = True
    """V-trace advantages of the learner's policy; `--no-advantage-alignment` uses GAE (ablation)"""
    tv_filter: bool = True
    """TV filtering; `--no-tv-filter` uses PPO's clipped surrogate instead (ablation)"""
    realign_every_epoch: bool = False
    """recompute the aligned advantages before every epoch, not once per update (the paper: once)"""

    # Actors and learner (torch.distributed, gloo)
    num_actors: Optional[int] = None
    """actor processes, ranks 1..N (rank 0 learns); default 1, or WORLD_SIZE - 1 under torchrun"""
    sync: bool = False
    """every update takes exactly one segment per actor, all acted with the current version (lag 0
    by construction): the synchronous, deterministic baseline"""
    max_policy_lag: Optional[int] = None
    """drop segments more than this many versions old when the learner takes them (default: keep all)"""
    queue_batches: int = 1
    """batches of segments the learner may hold waiting; a full queue holds the actors back (their
    reply waits), which bounds the lag"""
    actor_delay_ms: float = 0.0
    """lag on demand: actor r sleeps r x this many ms before sending each segment, so actors run at
    different speeds, as on a real cluster, and the slower ones' segments arrive older"""
    actor_timeout: float = 60.0
    """seconds an actor may stay silent before the learner counts it lost; with no data at all for
    that long the learner checkpoints and exits non-zero"""
    stop_on_actor_loss: bool = False
    """stop (checkpoint, exit non-zero) when an actor is lost, instead of carrying on without it"""
    master_port: int = 0
    """local launch: the learner's rendezvous port on 127.0.0.1 (0: any free one); torchrun sets its own"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


def check_args(args: Args) -> None:
    """Reject bad input with one line that names the problem (raised as SystemExit: no traceback)."""
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        if getattr(args, name) <= 0:
            sys.exit(f"error: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("tv_threshold", "rho_bar", "c_bar", "actor_timeout"):
        if getattr(args, name) <= 0:
            sys.exit(f"error: --{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.num_actors < 1:
        sys.exit(f"error: --num-actors must be >= 1, got {args.num_actors}")
    if args.num_envs % args.num_actors:
        sys.exit(f"error: --num-envs {args.num_envs} cannot be split evenly across {args.num_actors} actors")
    if args.queue_batches < 1:
        sys.exit(f"error: --queue-batches must be >= 1, got {args.queue_batches}")
    for name in ("max_policy_lag", "actor_delay_ms"):
        if (getattr(args, name) or 0) < 0:
            sys.exit(f"error: --{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 0 <= args.master_port < 65536:
        sys.exit(f"error: --master-port must be a port number (0 for any free one), got {args.master_port}")
    if args.eval_episodes < 0:
        sys.exit(f"error: --eval-episodes must be >= 0, got {args.eval_episodes}")
    if args.checkpoint_every < 0:
        sys.exit(f"error: --checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.batch_size % args.num_minibatches:
        sys.exit(
            f"error: the batch of {args.num_envs} envs x {args.num_steps} steps = {args.batch_size} "
            f"is not divisible by --num-minibatches {args.num_minibatches}"
        )
    if args.total_timesteps < args.batch_size:
        sys.exit(f"error: --total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size})")
    if tuple(map(int, gym.__version__.split(".")[:2])) < (1, 4):  # earlier vector RecordEpisodeStatistics
        sys.exit(f"error: gymnasium {gym.__version__} drops the first reward of every episode after an env's "
                 "first from the logged returns; pip install 'gymnasium>=1.4'")
    if args.env_id not in gym.registry:
        close = difflib.get_close_matches(args.env_id, list(gym.registry), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        sys.exit(f"error: unknown environment id '{args.env_id}'{hint}")


def make_env(env_id, idx, capture_video, run_name):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
        else:
            env = gym.make(env_id)
        return env

    return thunk


def make_envs(args, run_name):
    envs = gym.vector.SyncVectorEnv(  # the actor processes take the place of AsyncVectorEnv
        [make_env(args.env_id, i, args.capture_video, run_name) for i in range(args.num_envs)],
        # SAME_STEP: a finished sub-env resets within the step and hands back its last observation
        # in infos["final_obs"]. So no dummy transition (NEXT_STEP's reset step, whose action is
        # ignored) enters the batch, and truncations can bootstrap from V(final observation).
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        sys.exit(f"error: {args.env_id} has a {type(envs.single_action_space).__name__} action space; "
                 "this script needs a continuous (Box) one")
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def with_final_obs(obs, infos):
    """s_{t+1} of each env: the observation returned by the step, except where an episode ended,
    whose last observation SAME_STEP autoreset moved to infos["final_obs"]."""
    if "_final_obs" not in infos:
        return obs
    obs = obs.copy()
    for i in np.flatnonzero(infos["_final_obs"]):
        obs[i] = infos["final_obs"][i]
    return obs


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al.'s parallel algorithm)."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x):
        batch_mean, batch_var, batch_count = x.mean(0), x.var(0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total

    def state_dict(self):  # tensors and plain numbers: checkpoints load with weights_only=True
        return {"mean": torch.as_tensor(self.mean), "var": torch.as_tensor(self.var), "count": float(self.count)}

    def load_state_dict(self, state):
        self.mean, self.var, self.count = state["mean"].numpy(), state["var"].numpy(), state["count"]


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
        # `envs`: which of the envs these rewards come from (the learner scales each actor's envs
        # with the one set of statistics)
        returns = self.returns[envs]  # a view: updated in place
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
        mean = self.mean(obs)
        return mean, self.logstd.expand_as(mean)


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.critic = mlp(obs_dim, 1, out_std=1.0)
        self.actor = Actor(obs_dim, act_dim)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)


def gaussian_logprob(action, mean, logstd):
    """log N(action; mean, exp(logstd)) of the joint action (summed over its dimensions)."""
    return (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - 0.5 * np.log(2 * np.pi)).sum(-1)


def gaussian_entropy(logstd):
    return (0.5 + 0.5 * np.log(2 * np.pi) + logstd).sum(-1)


@torch.inference_mode()
def act(actor, obs, generator):
    """Sample an action for every env from the actor's policy; returns (action, behaviour log-prob)."""
    mean, logstd = actor(obs)
    action = mean + logstd.exp() * torch.randn(mean.shape, generator=generator)
    return action, gaussian_logprob(action, mean, logstd)


# --8<-- [start:compute_gae]
def compute_gae(rewards, values, next_values, terminations, dones, gamma, lam):
    """Generalized Advantage Estimation. All inputs are float tensors shaped [T, N] (time-major).

    next_values[t] = V(s_{t+1}), of the final observation when the episode was truncated at t;
    terminations[t] = 1 when s_{t+1} is terminal (nothing to bootstrap); dones[t] = 1 when the
    episode ended at t for any reason (the trace is cut there).
        delta_t = r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1},   A_T = 0
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
def vtrace_advantages(behavior_logprobs, target_logprobs, rewards, values, next_values,
                      terminations, dones, gamma, lam, rho_bar=1.0, c_bar=1.0):
    """All inputs are float tensors shaped [T, N] (time-major); returns (advantages, value_targets).

    V-trace (IMPALA) with lambda: the value and advantages of the target policy pi_T estimated from
    data of the behaviour policy beta. Same conventions as `compute_gae`.
        rho_t = pi_T(a_t|s_t) / beta(a_t|s_t),  c_t = lam * min(c_bar, rho_t)
        delta_t = min(rho_bar, rho_t) * (r_t + gamma * (1 - term_t) * V(s_{t+1}) - V(s_t))
        v_t - V(s_t) = delta_t + gamma * (1 - done_t) * c_t * (v_{t+1} - V(s_{t+1})),  zero after T
    value_targets = v_t. The advantages are the lambda-weighted policy-gradient form
        A_t = r_t + gamma * (1 - term_t) * [V(s_{t+1}) + lam * (1 - done_t) * (v_{t+1} - V(s_{t+1}))] - V(s_t)
    With beta = pi_T (all rho = 1, c = lam) v_t - V(s_t) and A_t are both exactly GAE(lambda).
    """
    rhos = torch.exp(target_logprobs - behavior_logprobs)
    deltas = torch.clamp(rhos, max=rho_bar) * (rewards + gamma * (1.0 - terminations) * next_values - values)
    discounts = gamma * (1.0 - dones) * lam * torch.clamp(rhos, max=c_bar)
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
    """Advantage alignment: advantages of the learner's *current* policy pi_T (not of the stale
    behaviour policies) by V-trace, and V-trace value targets for the critic, from the learner's
    current critic. Returns (values, target_logprobs, advantages, value_targets), each [T, N]."""
    values = agent.get_value(b["obs"])
    next_values = agent.get_value(b["next_obs"])
    target_logprobs = gaussian_logprob(b["actions"], *agent.actor(b["obs"]))
    if not args.advantage_alignment:  # ablation: GAE, as if beta were pi_T
        advantages = compute_gae(b["rewards"], values, next_values, b["terminations"], b["dones"],
                                 args.gamma, args.gae_lambda)
        return values, target_logprobs, advantages, advantages + values
    advantages, value_targets = vtrace_advantages(
        b["logprobs"], target_logprobs, b["rewards"], values, next_values, b["terminations"],
        b["dones"], args.gamma, args.gae_lambda, args.rho_bar, args.c_bar,
    )
    return values, target_logprobs, advantages, value_targets
# --8<-- [end:estimate_advantages]


# --8<-- [start:ppo_policy_loss]
def ppo_policy_loss(newlogprob, behavior_logprob, advantages, clip_coef):
    """PPO's clipped surrogate, with the ratio taken against the behaviour policy that acted:
        L = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)),   r = pi_theta(a|s) / beta(a|s)
    Returns (loss, ratio)."""
    ratio = (newlogprob - behavior_logprob).exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(pg_loss1, pg_loss2).mean(), ratio
# --8<-- [end:ppo_policy_loss]


# --8<-- [start:vaco_policy_loss]
def vaco_policy_loss(newlogprob, behavior_logprob, advantages, tv_threshold, reference_logprob=None):
    """TV filtering. Returns (loss, tv, filtered_fraction).

        r = pi_theta(a|s) / beta(a|s),     the surrogate's importance ratio
        q = pi_theta(a|s) / pi_ref(a|s),   pi_ref = beta (the paper), or pi_T (`reference_logprob`)
        TV(pi_theta, pi_ref) ~ tv = 1/2 mean|q - 1|
        if tv > delta: filter a sample when A * sign(q - 1) > 0, i.e. when following its gradient
                       would move q further from 1 (the policy further from pi_ref)
        L = -mean( r * A for kept samples,  sg(r * A) for filtered ones )
    Filtered samples give zero gradient but stay in the mean's denominator. No ratio clipping.
    """
    ratio = (newlogprob - behavior_logprob).exp()
    if reference_logprob is None:  # the paper's rule: the reference is the behaviour policy
        deviation = ratio.detach() - 1
    else:
        deviation = (newlogprob.detach() - reference_logprob).exp() - 1
    tv = 0.5 * deviation.abs().mean()
    filtered = (advantages * deviation > 0) & (tv > tv_threshold)  # A * (q - 1) > 0: same sign
    surrogate = ratio * advantages
    surrogate = torch.where(filtered, surrogate.detach(), surrogate)
    return -surrogate.mean(), tv, filtered.float().mean()
# --8<-- [end:vaco_policy_loss]


def save_checkpoint(path, state):
    """`state` holds tensors and plain numbers only (state dicts, statistics, counters, args)."""
    if os.path.exists(path):  # the run directory is new, so this only guards against misuse
        raise FileExistsError(f"refusing to overwrite {path}")
    torch.save(state, path)


def load_checkpoint(path):
    """weights_only=True: loading a checkpoint never runs code; a file that holds a pickled object
    (anything beyond tensors and plain containers) is refused with a one-line error."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        sys.exit(f"error: refusing to load {path}: it holds more than tensors and plain values "
                 "(a pickled object, which could run code)")
    except Exception as error:  # a truncated or foreign file
        sys.exit(f"error: cannot load checkpoint {path}: {str(error).splitlines()[0]}")


def load_agent(path, obs_dim, act_dim):
    checkpoint = load_checkpoint(path)
    agent = Agent(obs_dim, act_dim)
    agent.load_state_dict(checkpoint["agent"])
    obs_rms = RunningMeanStd((obs_dim,))
    obs_rms.load_state_dict(checkpoint["obs_rms"])
    return agent, obs_rms


@torch.inference_mode()
def evaluate(path, env_id, eval_episodes, seed):
    """Episodic returns of the saved policy: mean actions, frozen observation statistics."""
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
    agent, obs_rms = load_agent(path, env.observation_space.shape[0], env.action_space.shape[0])
    returns = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < eval_episodes:
        mean, _ = agent.actor(torch.as_tensor(normalize_obs(obs[None], obs_rms)))
        action = np.clip(mean[0].numpy(), env.action_space.low, env.action_space.high)
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
    env.close()
    return returns


def format_eta(seconds):
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m" if seconds >= 3600 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


# --- Messages -----------------------------------------------------------------------------------
# Every message is a fixed-size float32 tensor: a receiver must post a buffer of the right size,
# and both sides derive the sizes from the same settings (the learner's, sent at start-up).
# Integers stored in float32 are exact below 2^24 (versions, segment numbers, ranks, lengths).
# Tags keep the three kinds of message apart on each actor-learner pair.
# --8<-- [start:messages]
REPLY_TAG, WEIGHTS_TAG, SEGMENT_TAG = 1, 2, 3
CONTINUE, STOP, DISMISSED = 0, 1, 2  # reply codes: act on; the run is over; you were counted lost


class SegmentLayout:
    """A segment, what an actor sends after `num_steps` steps of its `num_envs` envs, as one flat
    float32 message. Observations are raw and rewards unscaled: the learner owns the statistics. It
    normalises observations with those of its current version (the ones the actor acted with, when
    the segment's lag is 0) and scales rewards with one set of return statistics for all envs."""

    HEADER = ("actor", "index", "version", "episodes", "wait_time", "run_time")

    def __init__(self, num_steps, num_envs, obs_dim, act_dim):
        T, n = num_steps, num_envs
        self.shapes = {
            # actor rank, segment number, behaviour version, episodes finished in the segment,
            # the actor's seconds spent waiting for replies, and since it started
            "header": (len(self.HEADER),),
            "obs": (T, n, obs_dim),  # s_t
            "next_obs": (T, n, obs_dim),  # s_{t+1}: the episode's final observation where it ended at t
            "actions": (T, n, act_dim),  # a_t as sampled (the env received it clipped)
            "logprobs": (T, n),  # log beta(a_t | s_t)
            "rewards": (T, n),
            "terminations": (T, n),
            "truncations": (T, n),
            "episode_returns": (T, n),  # where an episode ended at t: its return and length; else 0
            "episode_lengths": (T, n),
        }
        self.size = sum(int(np.prod(shape)) for shape in self.shapes.values())
        self.steps = T * n

    def views(self, message):
        """{field: numpy array viewing `message`}: writing a field writes the message (no packing copy)."""
        fields, start, flat = {}, 0, message.numpy()
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            fields[name] = flat[start : start + size].reshape(shape)
            start += size
        return fields


def pack_policy(actor, obs_rms):
    """What an actor needs to act, as one new float32 tensor: the actor network's parameters, then
    the observation mean and variance it normalises with. They travel together under one version:
    otherwise the behaviour log-probs stop matching the policy the learner evaluates."""
    parameters = nn.utils.parameters_to_vector(actor.parameters()).detach().cpu()
    statistics = torch.as_tensor(np.concatenate([obs_rms.mean, obs_rms.var]), dtype=torch.float32)
    return torch.cat([parameters, statistics])


def unpack_policy(weights, obs_dim):
    """The inverse of `pack_policy`: (the actor's parameters as one vector, the observation
    statistics rounded to float32 as sent; the learner normalises with the very same)."""
    statistics = weights[-2 * obs_dim :].double().numpy()
    obs_rms = RunningMeanStd((obs_dim,))
    obs_rms.mean, obs_rms.var = statistics[:obs_dim], statistics[obs_dim:]
    return weights[: -2 * obs_dim], obs_rms
# --8<-- [end:messages]


# --- Actors -------------------------------------------------------------------------------------

# --8<-- [start:collect_segment]
@torch.inference_mode()
def collect_segment(envs, actor, obs_rms, raw_obs, segment, generator):
    """Step the envs `num_steps` times with `actor`, writing every field of `segment` but its header
    in place. Observations are stored raw and normalised only to act. Returns the observation to
    continue from."""
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    segment["episode_returns"][:] = 0.0
    segment["episode_lengths"][:] = 0.0
    for step in range(segment["obs"].shape[0]):
        segment["obs"][step] = raw_obs
        # act on the observation as sent (float32), so that the learner evaluates the very same input
        action, logprob = act(actor, torch.as_tensor(normalize_obs(segment["obs"][step], obs_rms)), generator)
        segment["actions"][step], segment["logprobs"][step] = action.numpy(), logprob.numpy()

        # TRY NOT TO MODIFY: execute the game and log data.
        raw_obs, reward, termination, truncation, infos = envs.step(
            np.clip(segment["actions"][step], action_low, action_high)
        )
        segment["rewards"][step] = reward
        segment["terminations"][step], segment["truncations"][step] = termination, truncation
        segment["next_obs"][step] = with_final_obs(raw_obs, infos)
        for i in np.flatnonzero(infos.get("_episode", [])):
            segment["episode_returns"][step, i] = infos["episode"]["r"][i]
            segment["episode_lengths"][step, i] = infos["episode"]["l"][i]
    return raw_obs
# --8<-- [end:collect_segment]


# --8<-- [start:run_actor]
def run_actor(rank, args, run_name):
    """One actor: receive the newest policy, step the envs for a segment, send it, and so on until
    the learner says stop. Returns the exit code. Every torch.distributed call of an actor is here."""
    num_envs = args.num_envs // args.num_actors
    envs = make_envs(replace(args, num_envs=num_envs, capture_video=args.capture_video and rank == 1), run_name)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give
    actor = Actor(obs_dim, act_dim).requires_grad_(False)
    generator = torch.Generator().manual_seed(args.seed + rank)  # this actor's action noise
    layout = SegmentLayout(args.num_steps, num_envs, obs_dim, act_dim)
    # Two segment buffers, as a pipelined actor needs: gloo may read a buffer until wait() on its
    # send returns, so a buffer is reused only after that. (Here the learner answers a segment only
    # once it has received it, so that wait() returns at once.)
    buffers = [torch.zeros(layout.size), torch.zeros(layout.size)]
    sends = [None, None]
    reply = torch.zeros(2)  # [version, code]
    weights = pack_policy(actor, RunningMeanStd((obs_dim,)))  # a buffer of the right size

    # The synchronous script's envs, split across actors: env i of actor r has seed seed + (r-1)*n + i.
    raw_obs, _ = envs.reset(seed=args.seed + (rank - 1) * num_envs)
    envs.action_space.seed(args.seed + rank)
    version, index, wait_time, start = -1, 0, 0.0, time.time()
    while True:
        waiting_since = time.time()
        dist.recv(reply, src=0, tag=REPLY_TAG)  # the answer to the last segment (first: the initial policy)
        if reply[1] != CONTINUE:
            break
        if reply[0] > version:  # a newer version: its weights and statistics follow
            dist.recv(weights, src=0, tag=WEIGHTS_TAG)
            parameters, obs_rms = unpack_policy(weights, obs_dim)
            nn.utils.vector_to_parameters(parameters.clone(), actor.parameters())  # clone: `weights` is reused
            version = int(reply[0])
        wait_time += time.time() - waiting_since

        slot = index % 2
        if sends[slot] is not None:
            sends[slot].wait()
        segment = layout.views(buffers[slot])
        raw_obs = collect_segment(envs, actor, obs_rms, raw_obs, segment, generator)
        episodes = np.count_nonzero(segment["episode_lengths"])
        segment["header"][:] = [rank, index, version, episodes, wait_time, time.time() - start]
        time.sleep(rank * args.actor_delay_ms / 1000)  # --actor-delay-ms: stragglers on demand
        sends[slot] = dist.isend(buffers[slot], dst=0, tag=SEGMENT_TAG)
        index += 1

    for work in sends:  # wait on every send before leaving, or the learner sees a closed connection
        if work is not None:
            work.wait()
    envs.close()
    if reply[1] == DISMISSED:
        print(f"actor {rank}: the learner had counted this actor lost and dismissed it", file=sys.stderr)
        return 1
    return 0
# --8<-- [end:run_actor]


def actor_process(rank, world_size, args, port=None):
    """Entry point of an actor process: spawned by the learner (`port`: its store on 127.0.0.1) or
    started by torchrun. Exits 0 when the learner stops it, non-zero when the learner is gone."""
    # Ctrl-C reaches every process of the terminal: the learner decides, and then tells the actors.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        join_process_group(rank, world_size, args, port)
        run_name, learner_args = startup_exchange()
        code = run_actor(rank, Args(**learner_args), run_name)
        dist.destroy_process_group()
    except RuntimeError as e:  # gloo's, when the learner is gone: "Connection closed by peer", a timeout
        print(f"error: actor {rank} stopped: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
        code = 1
    sys.exit(code)


# --- Learner ------------------------------------------------------------------------------------

# --8<-- [start:learner_comm]
class LearnerComm(threading.Thread):
    """The learner's communication thread, its only caller of torch.distributed (one thread per
    process; `Work.wait` releases the GIL, so training goes on meanwhile).

    It receives segments from any actor (`recv` with `src=None` returns the sender's rank), hands
    them to the training loop through a bounded queue, and answers each with [version, code] and,
    if the actor's version is older, the newest weights. While the queue is full the answer waits,
    so the actor waits: backpressure that bounds the lag. With `sync` it collects one segment from
    every actor and answers them all once the learner has published the version trained on them.

    gloo point-to-point work cannot be polled (`is_completed()` turns true only inside `wait()`),
    and a `wait` that times out closes every connection of the group. So liveness is ours: the
    training loop watches `last_heard` and counts silent actors lost; a reply send is waited on
    only once its actor has sent again (so it has received it)."""

    def __init__(self, actors, segment_size, queue_size, sync, version, weights):
        super().__init__(name="learner-comm", daemon=True)  # daemon: a receive that never returns cannot hold the exit
        self.actors, self.segment_size, self.sync = list(actors), segment_size, sync
        self.segments = queue.Queue(maxsize=queue_size)
        self.changed = threading.Condition()  # guards the state below; notified on publish and stop
        self.published = (version, weights)
        self.replied_version = version  # the version of the last answers (--sync: all actors got it)
        self.sent_version = dict.fromkeys(self.actors, -1)  # the version of the weights each actor holds
        self.pending = {actor: [] for actor in self.actors}  # reply sends not waited on yet
        self.awaiting_reply = set()  # actors whose segment arrived and is not answered yet
        self.last_heard = dict.fromkeys(self.actors, time.time())
        self.lost = {}  # rank -> reason
        self.dismissed = set()  # actors told to stop
        self.received = 0
        self.stopping = False
        self.error = None

    def publish(self, version, weights):
        """Swap in a new version: a new tensor, never written in place (a send may still read the old one)."""
        with self.changed:
            self.published = (version, weights)
            self.changed.notify_all()

    def stop(self):
        """Every actor gets STOP with its next answer."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()

    def mark_lost(self, actor, reason):
        with self.changed:
            self.lost.setdefault(actor, reason)

    def live(self):
        with self.changed:
            return [actor for actor in self.actors if actor not in self.lost]

    def silent(self, timeout):
        """Live actors not heard from (a segment, or our answer) for `timeout` s, other than those
        waiting for an answer from us."""
        now = time.time()
        with self.changed:
            return [a for a in self.live() if a not in self.awaiting_reply and now - self.last_heard[a] > timeout]

    def run(self):
        try:
            self.serve()
        except Exception as e:  # a receive failed: the group is unusable; the training loop stops
            self.error = e

    def serve(self):
        for actor in self.actors:  # the initial (or resumed) policy
            self.reply(actor)
        while any(actor not in self.dismissed for actor in self.live()):
            message = torch.empty(self.segment_size)  # a new tensor per segment: the queue keeps it
            actor = dist.recv(message, src=None, tag=SEGMENT_TAG)
            with self.changed:
                self.received += 1
                self.awaiting_reply.add(actor)
                self.last_heard[actor] = time.time()
            if self.stopping or actor in self.lost or not self.put(message):
                self.reply(actor)  # STOP (the run is over) or DISMISSED (it was counted lost)
            elif not self.sync:
                self.reply(actor)
            elif self.awaiting_reply >= set(self.live()):  # --sync: every actor's segment is in
                with self.changed:
                    self.changed.wait_for(lambda: self.published[0] > self.replied_version or self.stopping)
                for waiting in sorted(self.awaiting_reply):
                    self.reply(waiting)
        for actor in self.dismissed - set(self.lost):  # they received STOP; let the sends finish
            for work in self.pending[actor]:
                work.wait()

    def put(self, message):
        """Queue a segment, blocking while the queue is full; False if the run stops meanwhile."""
        while not self.stopping:
            try:
                self.segments.put(message, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def reply(self, actor):
        """Answer `actor`: [version, code], then the weights if it holds an older version."""
        with self.changed:
            version, weights = self.published
            code = DISMISSED if actor in self.lost else STOP if self.stopping else CONTINUE
            self.awaiting_reply.discard(actor)
            self.last_heard[actor] = time.time()  # its silence counts from now
            self.replied_version = version
        try:
            for work in self.pending[actor]:  # it has sent a segment since, so it received these
                work.wait()
            self.pending[actor] = [dist.isend(torch.tensor([float(version), float(code)]), actor, tag=REPLY_TAG)]
            if code == CONTINUE and version > self.sent_version[actor]:
                self.pending[actor].append(dist.isend(weights, actor, tag=WEIGHTS_TAG))
                self.sent_version[actor] = version
        except RuntimeError as e:  # its connection is gone: the process died
            self.pending[actor] = []
            self.mark_lost(actor, f"connection lost ({str(e).splitlines()[0]})")
            return
        if code != CONTINUE:
            self.dismissed.add(actor)
# --8<-- [end:learner_comm]


class RunStopped(Exception):
    """The learner stops before its budget: why (the message) and the exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# --8<-- [start:watch_actors]
def watch_actors(comm, processes, args, reported):
    """Count actors lost: a process that exited (local launch) or silence beyond --actor-timeout.
    Prints each loss once; raises RunStopped when the run cannot or should not go on."""
    for rank, process in processes.items():
        if process.exitcode is not None:
            comm.mark_lost(rank, f"its process exited with code {process.exitcode}")
    for rank in comm.silent(args.actor_timeout):
        comm.mark_lost(rank, f"silent for more than --actor-timeout {args.actor_timeout:g} s")
    with comm.changed:
        new = {rank: reason for rank, reason in comm.lost.items() if rank not in reported}
    for rank, reason in new.items():
        reported.add(rank)
        print(f"actor {rank} lost: {reason}", flush=True)
    if comm.error is not None:
        raise RunStopped(f"communication failed: {str(comm.error).splitlines()[0]}", 1)
    if not comm.live():
        raise RunStopped("no actor left", 1)
    if new and (args.stop_on_actor_loss or args.sync):
        why = "--stop-on-actor-loss" if args.stop_on_actor_loss else "--sync needs every actor"
        raise RunStopped(f"actor {', '.join(map(str, new))} lost ({why})", 1)


def next_segment(comm, check):
    """The next segment from the queue. While waiting, `check()` runs every 0.1 s: it watches the
    actors and the stop request, and raises RunStopped."""
    while True:
        check()
        try:
            return comm.segments.get(timeout=0.1)
        except queue.Empty:
            pass
# --8<-- [end:watch_actors]


def handle_signals(stop_request, processes):
    """First Ctrl-C (or SIGTERM, which torchrun sends when a worker fails): stop after the current
    update with a checkpoint. A second one kills the actors and exits at once."""

    def handler(signum, frame):
        if stop_request:
            for process in processes.values():
                process.kill()
            os._exit(128 + signum)
        stop_request.append(signum)
        print(f"\n{signal.Signals(signum).name}: stopping after this update, with a checkpoint "
              "(again to kill)", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# --- Launch -------------------------------------------------------------------------------------

# --8<-- [start:resolve_launch]
def resolve_launch(args):
    """(rank, world size, started by torchrun?). Fills in args.num_actors."""
    if dist.is_torchelastic_launched():  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if args.num_actors is None:
            args.num_actors = world_size - 1
        elif world_size != args.num_actors + 1:
            sys.exit(f"error: torchrun started {world_size} processes, but --num-actors {args.num_actors} "
                     f"needs {args.num_actors + 1} (a learner and the actors)")
        if world_size < 2:
            sys.exit("error: torchrun started 1 process; the learner needs at least 1 actor (--nproc-per-node 2 or more)")
        return rank, world_size, True
    if args.num_actors is None:
        args.num_actors = 1
    return 0, args.num_actors + 1, False
# --8<-- [end:resolve_launch]


def process_group_timeout(args):
    """gloo applies it to every wait, and a wait that times out closes every connection of the
    group; so it must exceed any quiet time of a healthy run (liveness is our own protocol)."""
    return datetime.timedelta(seconds=max(600.0, 2 * args.actor_timeout))


def join_process_group(rank, world_size, args, port=None):
    """torchrun's rendezvous (env://), or when launched here, the learner's store on 127.0.0.1."""
    timeout = process_group_timeout(args)
    if port is None:
        dist.init_process_group("gloo", timeout=timeout)
    else:
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def startup_exchange(run_name=None, args=None):
    """The one collective, at start-up: every actor takes the learner's run name and settings (so
    message sizes agree whatever each node's command line said). Returns them."""
    objects = [run_name, None if args is None else vars(args)]
    dist.broadcast_object_list(objects, src=0)
    return objects


def open_store(args, world_size):
    """Local launch: the learner's rendezvous store on 127.0.0.1 (the actors connect to its port)."""
    try:
        return dist.TCPStore("127.0.0.1", args.master_port, world_size, is_master=True,
                             timeout=process_group_timeout(args), wait_for_workers=False)
    except dist.DistNetworkError as e:
        why = "the port is in use" if "EADDRINUSE" in str(e) else str(e).splitlines()[0]
        sys.exit(f"error: cannot listen on 127.0.0.1:{args.master_port}: {why} "
                 "(choose another --master-port, or 0 for any free one)")


def start_actors(args, world_size, port):
    """Local launch: one process per actor, started with spawn (a fresh interpreter: nothing is
    forked from this one, threads and locks included). Returns {rank: process}."""
    context = mp.get_context("spawn")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited: a Ctrl-C cannot hit their start-up
    processes = {
        rank: context.Process(target=actor_process, args=(rank, world_size, args, port), name=f"actor-{rank}",
                              daemon=True)
        for rank in range(1, world_size)
    }
    for process in processes.values():
        process.start()
    signal.signal(signal.SIGINT, previous)
    return processes


def join_with_watchdog(store, world_size, args, processes):
    """The learner joins the group, which waits for every actor; an actor that dies first ends it."""
    joined = threading.Event()

    def watch():
        while not joined.wait(0.2):
            for rank, process in processes.items():
                if process.exitcode is not None:
                    print(f"error: actor {rank} exited during start-up (code {process.exitcode})",
                          file=sys.stderr, flush=True)
                    stop_actors(processes, timeout=0)
                    os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    dist.init_process_group("gloo", store=store, rank=0, world_size=world_size, timeout=process_group_timeout(args))
    joined.set()


def stop_actors(processes, timeout, lost=()):
    """Kill the processes of lost actors at once; give the others up to `timeout` s to exit, then
    kill them too: none outlives the learner."""
    deadline = time.time() + timeout
    for rank, process in processes.items():
        if rank not in lost:
            process.join(max(0.0, deadline - time.time()))
    for process in processes.values():
        if process.is_alive():
            process.kill()
            process.join()


def main(args: Args):
    rank, world_size, torchrun = resolve_launch(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    check_args(args)
    if rank > 0:  # torchrun started this process as an actor: it takes the learner's settings
        actor_process(rank, world_size, args)
    if args.resume is not None and not os.path.isfile(args.resume):  # the learner's file, on its machine
        sys.exit(f"error: --resume {args.resume}: no such file")
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if os.path.exists(f"runs/{run_name}"):  # never mix two runs' logs or checkpoints
        sys.exit(f"error: runs/{run_name} already exists; wait a second or change --exp-name")
    if args.capture_video and "DISPLAY" not in os.environ:
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede mujoco's import

    # env setup (checked before any process starts or any log is written); the actors step the envs
    envs = make_envs(replace(args, num_envs=1, capture_video=False), run_name)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    envs.close()
    budget = args.num_iterations * args.batch_size  # env steps the learner takes from the actors
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    if checkpoint and checkpoint["args"]["env_id"] != args.env_id:
        sys.exit(f"error: --resume {args.resume} was trained on {checkpoint['args']['env_id']}, "
                 f"not {args.env_id}; pass --env-id {checkpoint['args']['env_id']}")
    if checkpoint and checkpoint["global_step"] >= budget:
        sys.exit(f"error: --resume {args.resume} is already at step {checkpoint['global_step']}; "
                 f"raise --total-timesteps above it to train on")
    store = None if torchrun else open_store(args, world_size)  # where the actors will find the learner

    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order (each actor seeds its action noise)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    agent = Agent(obs_dim, act_dim).to(device)
    # fused: one kernel for all parameters instead of a dozen small ops each (same update)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd((obs_dim,))
    reward_scaler = RewardScaler(args.num_envs, args.gamma)  # all envs; each actor's are a slice

    def training_state(global_step, version):
        """Everything a resumed run needs, as tensors and plain numbers."""
        return {"agent": agent.state_dict(), "optimizer": optimizer.state_dict(),
                "obs_rms": obs_rms.state_dict(), "reward_rms": reward_scaler.return_rms.state_dict(),
                "generator": generator.get_state(), "global_step": global_step,
                "iteration": version, "args": vars(args)}

    global_step, version = 0, 0  # version: the number of updates, what the actors' policies are tagged with
    if checkpoint:
        try:
            agent.load_state_dict(checkpoint["agent"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        except (RuntimeError, ValueError) as error:
            sys.exit(f"error: --resume {args.resume} does not fit this network: {str(error).splitlines()[0]}")
        obs_rms.load_state_dict(checkpoint["obs_rms"])
        reward_scaler.return_rms.load_state_dict(checkpoint["reward_rms"])
        generator.set_state(checkpoint["generator"])
        global_step, version = checkpoint["global_step"], checkpoint["iteration"]
        print(f"resumed from {args.resume} at step {global_step} (version {version})")

    # --8<-- [start:launch]
    # Launch: the learner's process group waits for every actor; from here on, point-to-point only.
    stop_request, processes = [], {}
    handle_signals(stop_request, processes)
    if torchrun:
        join_process_group(rank, world_size, args)
    else:
        processes.update(start_actors(args, world_size, store.port))  # a second Ctrl-C kills these
        join_with_watchdog(store, world_size, args, processes)
    startup_exchange(run_name, args)
    print(f"learner: {world_size - 1} actor(s) joined; training from step {global_step}, version {version}", flush=True)
    layout = SegmentLayout(args.num_steps, args.num_envs // args.num_actors, obs_dim, act_dim)
    weights = pack_policy(agent.actor, obs_rms)
    _, policy_rms = unpack_policy(weights, obs_dim)  # what the actors normalise with, in float32
    comm = LearnerComm(range(1, world_size), layout.size, args.queue_batches * args.num_actors, args.sync,
                       version, weights)
    comm.start()
    # --8<-- [end:launch]

    reported = set()  # lost actors already announced

    def check():
        if stop_request:
            raise RunStopped(f"interrupted ({signal.Signals(stop_request[0]).name})", 128 + stop_request[0])
        watch_actors(comm, processes, args, reported)

    recent_returns = collections.deque(maxlen=100)
    envs_per_actor = args.num_envs // args.num_actors
    steps_by_actor = collections.Counter()
    actor_wait = {}  # rank -> the share of its time its last segment reports waiting for replies
    used = dropped = updates = 0
    learner_wait = 0.0
    stopped = None

    # TRY NOT TO MODIFY: start the game
    start_step = global_step
    start_time = last_print = time.time()
    while global_step < budget:
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - global_step / budget
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # --8<-- [start:take_batch]
        # The batch: num_actors segments (num_envs x num_steps transitions) from whichever actors
        # sent them first, minus those more than --max-policy-lag versions old. The real lag of a
        # segment: the learner's version now - the version that acted (its time in the queue included).
        batch, lags = [], []
        while len(batch) < args.num_actors and global_step < budget and stopped is None:
            wanted = min(args.num_actors - len(batch), (budget - global_step) // layout.steps)
            waiting_since = time.perf_counter()
            try:
                messages = [layout.views(next_segment(comm, check)) for _ in range(wanted)]
            except RunStopped as e:
                stopped = e
            learner_wait += time.perf_counter() - waiting_since
            # in actor order: a --sync batch (one segment per actor) is processed alike in every run
            for segment in sorted(messages if stopped is None else [], key=lambda s: tuple(s["header"][:2])):
                actor, _, behaviour_version, _, wait_time, run_time = segment["header"]
                actor = int(actor)
                global_step += layout.steps
                steps_by_actor[actor] += layout.steps
                actor_wait[actor] = wait_time / max(run_time, 1e-9)
                # the learner scales rewards with one set of statistics, in each env's step order
                dones = (segment["terminations"] + segment["truncations"]) > 0
                envs_of_actor = slice((actor - 1) * envs_per_actor, actor * envs_per_actor)
                for step in range(args.num_steps):
                    segment["rewards"][step] = reward_scaler(segment["rewards"][step], dones[step], envs_of_actor)
                for step, i in zip(*np.nonzero(segment["episode_lengths"])):
                    recent_returns.append(float(segment["episode_returns"][step, i]))
                    writer.add_scalar("charts/episodic_return", segment["episode_returns"][step, i], global_step)
                    writer.add_scalar("charts/episodic_length", segment["episode_lengths"][step, i], global_step)
                lag = version - int(behaviour_version)
                if args.max_policy_lag is not None and lag > args.max_policy_lag:
                    dropped += 1
                    continue
                batch.append(segment)
                lags.append(lag)
        if stopped is not None or len(batch) < args.num_actors:
            break  # interrupted, or the budget ran out while old segments were dropped

        # Segments side by side: [T, n, ...] each -> [T, N, ...]. Observations are normalised with
        # the statistics of the current version, those the actors acted with when the lag is 0.
        obs, next_obs, actions, logprobs, rewards, terminations, truncations = (
            np.concatenate([segment[key] for segment in batch], axis=1)
            for key in ("obs", "next_obs", "actions", "logprobs", "rewards", "terminations", "truncations")
        )
        dones = np.maximum(terminations, truncations)
        b = {
            key: torch.as_tensor(value, device=device)
            for key, value in dict(obs=normalize_obs(obs, policy_rms), next_obs=normalize_obs(next_obs, policy_rms),
                                   actions=actions, logprobs=logprobs, rewards=rewards, terminations=terminations,
                                   dones=dones).items()
        }
        # --8<-- [end:take_batch]
        values, target_logprobs, advantages, returns = estimate_advantages(agent, b, args)
        # Backward lag: how far the learner already is from the behaviour policies, before any step.
        start_ratio = (target_logprobs - b["logprobs"]).exp()
        backward_tv = 0.5 * (start_ratio - 1).abs().mean().item()
        writer.add_scalar("charts/backward_tv", backward_tv, global_step)
        writer.add_scalar("charts/rho_clipped_fraction", (start_ratio > args.rho_bar).float().mean().item(), global_step)

        # flatten the batch: [T, N, ...] -> [T * N, ...]
        flat = dict(obs=b["obs"], actions=b["actions"], logprobs=b["logprobs"], advantages=advantages,
                    returns=returns, proximal_logprobs=target_logprobs)
        flat = {key: value.reshape(args.batch_size, *value.shape[2:]) for key, value in flat.items()}

        # Optimizing the policy and value network
        stats = collections.defaultdict(list)
        for epoch in range(args.update_epochs):
            if args.realign_every_epoch and epoch > 0:  # option: align to the current pi_theta again
                _, _, advantages, returns = estimate_advantages(agent, b, args)
                flat["advantages"], flat["returns"] = advantages.reshape(-1), returns.reshape(-1)
            b_inds = torch.randperm(args.batch_size, generator=generator)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = {key: value[b_inds[start : start + args.minibatch_size]] for key, value in flat.items()}
                mean, logstd = agent.actor(mb["obs"])
                newlogprob = gaussian_logprob(mb["actions"], mean, logstd)
                entropy = gaussian_entropy(logstd)
                newvalue = agent.get_value(mb["obs"])

                # --8<-- [start:minibatch_loss]
                mb_advantages = mb["advantages"]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss: TV filtering (no ratio clipping)
                if args.tv_filter:
                    reference = mb["proximal_logprobs"] if args.tv_reference == "proximal" else None
                    pg_loss, tv, filtered_fraction = vaco_policy_loss(
                        newlogprob, mb["logprobs"], mb_advantages, args.tv_threshold, reference
                    )
                    stats["filtered_fraction"].append(filtered_fraction)
                    stats["filter_on_fraction"].append((tv > args.tv_threshold).float())
                    stats["filter_tv"].append(tv)  # the TV compared with delta
                else:  # ablation: PPO's clipped surrogate
                    pg_loss, _ = ppo_policy_loss(newlogprob, mb["logprobs"], mb_advantages, args.clip_coef)
                logratio = newlogprob - mb["logprobs"]
                ratio = logratio.exp()
                # k3 estimator of KL(behaviour || policy) from behaviour samples: (r - 1) - log r
                kl = ((ratio - 1) - logratio).mean()

                # Value loss: regression on the V-trace targets
                v_loss = 0.5 * ((newvalue - mb["returns"]) ** 2).mean()

                # the entropy bonus keeps the maximum-entropy objective
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                # --8<-- [end:minibatch_loss]

                with torch.no_grad():
                    stats["policy_loss"].append(pg_loss)
                    stats["value_loss"].append(v_loss)
                    stats["entropy"].append(entropy_loss)
                    stats["old_approx_kl"].append((-logratio).mean())
                    stats["approx_kl"].append(kl)
                    stats["clipfrac"].append(((ratio - 1.0).abs() > args.clip_coef).float().mean())
                    stats["tv_divergence"].append(0.5 * (ratio - 1).abs().mean())

            if args.target_kl is not None and stats["approx_kl"][-1] > args.target_kl:
                break

        # --8<-- [start:publish]
        # Publish the new version: the weights, and the observation statistics updated with this batch.
        version += 1
        updates += 1
        used += len(batch)
        obs_rms.update(obs.reshape(-1, obs_dim))
        weights = pack_policy(agent.actor, obs_rms)
        _, policy_rms = unpack_policy(weights, obs_dim)
        comm.publish(version, weights)
        # --8<-- [end:publish]

        y_pred, y_true = values.cpu().numpy().ravel(), returns.cpu().numpy().ravel()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        elapsed = time.time() - start_time
        sps = int((global_step - start_step) / elapsed)
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for name, values_list in stats.items():  # means over all minibatches of the update
            writer.add_scalar(f"losses/{name}", torch.stack(values_list).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/policy_lag_mean", np.mean(lags), global_step)
        writer.add_scalar("charts/policy_lag_max", max(lags), global_step)
        writer.add_histogram("charts/policy_lag", np.array(lags), global_step)
        writer.add_scalar("charts/queue_depth", comm.segments.qsize(), global_step)
        writer.add_scalar("charts/segments_received", comm.received, global_step)
        writer.add_scalar("charts/segments_used", used, global_step)
        writer.add_scalar("charts/segments_dropped", dropped, global_step)
        writer.add_scalar("charts/updates_per_second", updates / elapsed, global_step)
        writer.add_scalar("charts/learner_wait_fraction", learner_wait / elapsed, global_step)
        writer.add_scalar("charts/actor_wait_fraction", np.mean(list(actor_wait.values())), global_step)
        writer.add_scalar("charts/actors_alive", len(comm.live()), global_step)
        for actor, steps in steps_by_actor.items():
            writer.add_scalar(f"actors/actor_{actor}_SPS", steps / elapsed, global_step)
            writer.add_scalar(f"actors/actor_{actor}_wait_fraction", actor_wait[actor], global_step)
        if time.time() - last_print > 10 or global_step >= budget:
            last_print = time.time()
            recent = f"{np.mean(recent_returns):.1f}" if recent_returns else "n/a"
            eta = (budget - global_step) / max(sps, 1)
            print(f"step {global_step}/{budget} ({100 * global_step / budget:.0f}%) | SPS: {sps} | "
                  f"return (last {len(recent_returns)} eps) {recent} | lag {np.mean(lags):.2f} | "
                  f"ETA {format_eta(eta)}", flush=True)
        if args.save_model and args.checkpoint_every and version % args.checkpoint_every == 0 \
                and global_step < budget:
            save_checkpoint(f"runs/{run_name}/{args.exp_name}_step{global_step}.cleanrl_model",
                            training_state(global_step, version))

    if recent_returns:
        print(f"final: mean episodic return of the last {len(recent_returns)} episodes = "
              f"{np.mean(recent_returns):.1f}")
    elapsed = time.time() - start_time
    print(f"segments: {used} used, {dropped} dropped, {comm.received} received | time waiting: learner "
          f"{learner_wait / elapsed:.0%} (for data), actors {np.mean(list(actor_wait.values()) or [0]):.0%} "
          "(for replies)", flush=True)
    # Checkpoint before the actors are told to stop: under torchrun a SIGTERM is followed by a
    # SIGKILL if the shutdown takes long. An interrupted or failed run always keeps its state.
    model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
    if args.save_model or stopped is not None:
        save_checkpoint(model_path, training_state(global_step, version))
        print(f"model saved to {model_path} (step {global_step}, version {version})", flush=True)
    comm.stop()  # every live actor gets STOP in answer to its next segment
    deadline = time.time() + args.actor_timeout
    while comm.is_alive() and time.time() < deadline and any(
            rank not in processes or processes[rank].exitcode is None for rank in comm.live()):
        comm.join(0.1)
    stop_actors(processes, timeout=0 if comm.is_alive() else 10, lost=comm.lost)
    if not comm.is_alive():
        dist.destroy_process_group()

    if args.save_model and stopped is None:
        episodic_returns = evaluate(model_path, args.env_id, args.eval_episodes, seed=args.seed + 10_000)
        for idx, episodic_return in enumerate(episodic_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        if episodic_returns:
            print(f"eval: mean return over {len(episodic_returns)} episodes = {np.mean(episodic_returns):.1f}")

    writer.close()
    if args.track:
        wandb.finish()
    code = 0 if stopped is None else stopped.code
    if stopped is not None:
        print(f"error: stopped at step {global_step}, version {version}: {stopped}; continue with --resume {model_path}",
              file=sys.stderr, flush=True)
    if comm.is_alive():  # blocked in a receive from an actor that never answered the stop: leave now
        print(f"actors {sorted(set(comm.live()) - comm.dismissed)} did not answer the stop; their processes "
              "were killed (local launch) or are left to the launcher", flush=True)
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main(tyro.cli(Args))
