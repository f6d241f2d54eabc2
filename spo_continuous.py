# SPO for continuous control (MuJoCo) under simulated policy lag. Single file, CleanRL style.
# Docs: docs/spo_continuous.md (the `# --8<--` lines mark the excerpts it shows)
"""Simple Policy Optimization (SPO; Xie et al., ICML 2025, arXiv 2401.16025) whose actors act
with stale copies of the policy: a baseline of the VACO paper (arXiv 2603.01365).

SPO keeps PPO's pipeline and replaces the clipped surrogate with a smooth penalty on the ratio:
each sample's objective is a parabola in the ratio rho that peaks at rho = 1 + sign(A) * epsilon, so a sample
that has moved past the trust region is pulled back instead of merely losing its gradient.

On-policy methods assume the batch came from the policy being updated. In distributed training
it did not: each actor acts with whatever policy it last received. We simulate that here
(``--policy-buffer K``): the learner keeps its last K policy snapshots, and before each rollout
every env ("actor") draws one of them at random and acts with it for the whole rollout. K = 1 is
ordinary synchronous SPO. This file is ``ppo_continuous.py`` with the policy loss changed:
``diff ppo_continuous.py spo_continuous.py`` shows exactly the method.

    python spo_continuous.py --env-id Ant-v4 --policy-buffer 8
    python spo_continuous.py --env-id Hopper-v4 --epsilon 0.2
    tensorboard --logdir runs
"""

import collections
import copy
import dataclasses
import difflib
import os
import pickle
import signal
import sys
import time
import zipfile
from dataclasses import dataclass, field
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
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
    """the number of parallel game environments, each one simulated actor with its own stale policy
    (8 actors make every batch mix policy ages, as in a real asynchronous system)"""
    num_steps: int = 256
    """the number of steps to run in each environment per policy rollout (8 x 256: CleanRL's batch of 2048)"""
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
    epsilon: float = 0.2
    """SPO's epsilon: each sample's objective peaks where |rho - 1| = epsilon (rho = pi_theta/beta)"""
    clip_coef: float = 0.2
    """the value-loss clipping coefficient (with `--clip-vloss`, as in CleanRL's PPO)"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (stops the epochs of an update early)"""

    # Simulated asynchrony
    policy_buffer: int = 1
    """K: actors act with one of the learner's last K policy snapshots (1 = synchronous training)"""

    # Run management: naming, logging, checkpoints, evaluation, speed
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment: same seed, machine and flags give the same returns"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (env 0, saved to `videos/<run_name>`)"""
    save_model: bool = False
    """whether to save a checkpoint to `runs/<run_name>/` and then evaluate it"""
    eval_episodes: int = 10
    """episodes of deterministic evaluation of the saved checkpoint (with `--save-model`)"""
    checkpoint_every: int = 0
    """with `--save-model`, also save a checkpoint every this many updates (0: only at the end)"""
    resume: Optional[str] = None
    """continue a run from a checkpoint it saved, with its settings (the envs start new episodes; the logs go to a new
    run folder); only its length, name, logs, checkpoints, evaluation, compile and layout of envs may change"""
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
    envs = gym.vector.SyncVectorEnv(
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

    def __call__(self, rewards, dones):
        self.returns = self.returns * self.gamma + rewards
        self.return_rms.update(self.returns)
        self.returns[dones] = 0.0  # a new episode starts a new discounted return
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


# --8<-- [start:lag_simulator]
class PolicyBuffer:
    """The simulated actors' stale policies: a FIFO of the learner's last K actor snapshots.

    Snapshots are frozen deep copies, so later updates of the learner never reach them. Age 0 is
    the newest snapshot (pi_T, the learner at the update's start), age K-1 the oldest. After each update
    the learner's new policy joins (`push`); before each rollout every actor draws one (`sample_ages`)."""

    def __init__(self, actor, size):
        self.snapshots = collections.deque(maxlen=size)
        self.push(actor)

    def push(self, actor):
        self.snapshots.append(copy.deepcopy(actor).requires_grad_(False))

    def sample_ages(self, num_actors, rng):
        """Each actor draws one snapshot uniformly among those held (fewer than K early on), to act
        with until the next draw. Returns the ages, and the actors grouped by age for `act`."""
        ages = rng.integers(len(self.snapshots), size=num_actors)
        return ages, [(age, torch.as_tensor(np.flatnonzero(ages == age))) for age in np.unique(ages)]

    def __getitem__(self, age):
        return self.snapshots[-1 - age]

    def act(self, obs, groups, generator):
        """Sample each actor's action from its own snapshot (`groups`: [(age, actor indices)]); returns
        (action, mean, log-std): the actors' Gaussians, whose log-probabilities the rollout takes at its end."""
        if len(groups) == 1:  # all actors share one snapshot (always when K = 1): skip the scatter
            mean, logstd = self[groups[0][0]](obs)
        else:
            mean = torch.empty(obs.shape[0], self[0].logstd.shape[-1])
            logstd = torch.empty_like(mean)
            for age, envs_idx in groups:  # one forward per snapshot in use
                mean[envs_idx], logstd[envs_idx] = self[age](obs[envs_idx])
        action = mean + logstd.exp() * torch.randn(mean.shape, generator=generator)
        return action, mean, logstd
# --8<-- [end:lag_simulator]


# --8<-- [start:rollout]
@torch.inference_mode()  # acting needs no gradients
def collect_rollout(envs, num_steps, policy_buffer, groups, obs_rms, reward_scaler, current_obs, generator):
    """Step the envs `num_steps` times, each actor with the snapshot it drew (observation statistics updated
    at every step). Returns the rollout, time-major [T, N, ...], where next_obs[t] is the real s_{t+1} (the
    final observation where an episode ended at t), the normalised observation to continue from, and the
    episodes that ended: (return, length, step)."""
    shapes = dict(obs=envs.single_observation_space.shape, next_obs=envs.single_observation_space.shape,
                  actions=envs.single_action_space.shape, rewards=(), terminations=(), dones=())
    rollout = {key: np.zeros((num_steps, envs.num_envs, *shape), np.float32) for key, shape in shapes.items()}
    means = np.zeros_like(rollout["actions"])  # the actors' means, for the log-probabilities at the end
    low, high = envs.single_action_space.low, envs.single_action_space.high
    episodes = []
    for step in range(num_steps):
        rollout["obs"][step] = current_obs
        action, mean, logstd = policy_buffer.act(torch.as_tensor(current_obs), groups, generator)
        rollout["actions"][step], means[step] = action.numpy(), mean.numpy()

        raw_obs, reward, termination, truncation, infos = envs.step(np.clip(action.numpy(), low, high))
        done = termination | truncation
        rollout["rewards"][step] = reward_scaler(reward, done)
        rollout["terminations"][step], rollout["dones"][step] = termination, done
        obs_rms.update(raw_obs)
        current_obs = normalize_obs(raw_obs, obs_rms)
        rollout["next_obs"][step] = (normalize_obs(with_final_obs(raw_obs, infos), obs_rms) if done.any()
                                     else current_obs)
        if done.any():
            for i in np.flatnonzero(infos["_episode"]):
                episodes.append((float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i]), step))
    # the behaviour log-probabilities, all steps at once (each actor's log-std is the same at every step)
    rollout["behaviour_logprobs"] = gaussian_logprob(torch.as_tensor(rollout["actions"]), torch.as_tensor(means),
                                                     logstd).numpy()
    return rollout, current_obs, episodes
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


# --8<-- [start:estimate_advantages]
@torch.no_grad()
def estimate_advantages(agent, b, args):
    """GAE advantages and return targets from the learner's *current* critic (the actors have none), plus
    the batch actions' log-probabilities under pi_T, the learner at the update's start (to measure backward lag).
    Returns {values, proximal_logprobs, advantages, returns}, each shaped [T, N]."""
    values = agent.get_value(b["obs"])
    next_values = agent.get_value(b["next_obs"])
    proximal_logprobs = gaussian_logprob(b["actions"], *agent.actor(b["obs"]))
    advantages = compute_gae(b["rewards"], values, next_values, b["terminations"], b["dones"],
                             args.gamma, args.gae_lambda)
    returns = advantages + values
    return dict(values=values, proximal_logprobs=proximal_logprobs, advantages=advantages, returns=returns)
# --8<-- [end:estimate_advantages]


# --8<-- [start:spo_policy_loss]
def spo_policy_loss(newlogprob, behaviour_logprobs, advantages, epsilon):
    """SPO's objective, with the ratio taken against the behaviour policy that acted:
        L = -mean(rho * A - |A| / (2 * eps) * (rho - 1)^2),   rho = pi_theta(a|s) / beta(a|s)
    Per sample, d/drho = A - |A| (rho - 1) / eps = 0 at rho = 1 + sign(A) * eps: inside that point
    the gradient moves rho towards it, beyond it the gradient pulls rho back (PPO's clip only stops pushing).
    Returns (loss, ratio)."""
    ratio = (newlogprob - behaviour_logprobs).exp()
    return -(advantages * ratio - advantages.abs() * (ratio - 1) ** 2 / (2 * epsilon)).mean(), ratio
# --8<-- [end:spo_policy_loss]


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

    # Policy loss
    pg_loss, ratio = spo_policy_loss(newlogprob, mb["behaviour_logprobs"], mb_advantages, args.epsilon)
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
                 approx_kl=kl, clipfrac=((ratio - 1.0).abs() > args.epsilon).float().mean(),  # past the peak
                 tv_divergence=0.5 * (ratio - 1).abs().mean())
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


def main(args: Args):
    stop = Stop()  # Ctrl-C, SIGTERM: the update under way ends, then the run saves a checkpoint and exits
    checkpoint = check_args(args)  # before anything runs: the options, and the checkpoint of --resume
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"

    envs = make_envs(args, run_name)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]

    torch.manual_seed(args.seed)  # the networks' initial weights
    torch.set_num_threads(1)  # tiny MLPs: thread hand-offs cost more than they give
    generator = torch.Generator().manual_seed(args.seed)  # minibatch order
    action_generator = torch.Generator().manual_seed(args.seed + 1)  # the actors' action noise
    lag_rng = np.random.default_rng(args.seed)  # which snapshot each actor draws

    agent = Agent(obs_dim, act_dim)
    params = {name: p.detach() for name, p in agent.named_parameters()}  # views: updating them updates the agent
    adam = adam_state(params)
    lr = torch.tensor(args.learning_rate)
    update = compiled_or_eager(train_step, args.compile)
    policy_buffer = PolicyBuffer(agent.actor, args.policy_buffer)
    obs_rms = RunningMeanStd(shape=(obs_dim,))
    reward_scaler = RewardScaler(args.num_envs, args.gamma)
    # what a checkpoint holds, and --resume restores
    saved = dict(agent=agent, optimizer=adam, obs_rms=obs_rms, reward_rms=reward_scaler.return_rms,
                 policy_buffer=policy_buffer, generator=generator, action_generator=action_generator, lag_rng=lag_rng)
    global_step, start_iteration, num_iterations = resume(checkpoint, saved, args)  # 0, 1, args.num_iterations new
    writer = open_logs(args, run_name)  # after every check: a run that exits early leaves no logs

    recent_returns = collections.deque(maxlen=100)
    progress = Progress(global_step, global_step + (num_iterations - start_iteration + 1) * args.batch_size)
    raw_obs, _ = envs.reset(seed=args.seed)
    obs_rms.update(raw_obs)
    current_obs = normalize_obs(raw_obs, obs_rms)

    for iteration in range(start_iteration, num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / num_iterations
            lr.fill_(frac * args.learning_rate)

        # Simulated asynchrony: each actor acts with a snapshot of age 0..K-1 for the whole rollout.
        ages, groups = policy_buffer.sample_ages(args.num_envs, lag_rng)
        writer.add_scalar("charts/policy_lag_mean", ages.mean(), global_step)
        writer.add_scalar("charts/policy_lag_max", ages.max(), global_step)
        rollout, current_obs, episodes = collect_rollout(envs, args.num_steps, policy_buffer, groups, obs_rms,
                                                         reward_scaler, current_obs, action_generator)
        for ret, length, step in episodes:
            recent_returns.append(ret)
            ended_at = global_step + (step + 1) * args.num_envs  # logged at the env step that ended it
            writer.add_scalar("charts/episodic_return", ret, ended_at)
            writer.add_scalar("charts/episodic_length", length, ended_at)
        global_step += args.batch_size

        b = {key: torch.as_tensor(value) for key, value in rollout.items()}
        b.update(estimate_advantages(agent, b, args))
        # Backward lag, before any step: the weights w = pi_T/beta, how far the learner is from the behaviour policies
        weight = (b["proximal_logprobs"] - b["behaviour_logprobs"]).exp()
        writer.add_scalar("charts/backward_tv", 0.5 * (weight - 1).abs().mean().item(), global_step)
        writer.add_scalar("charts/backward_ratio_mean", weight.mean().item(), global_step)
        writer.add_scalar("charts/backward_ratio_max", weight.max().item(), global_step)

        # flatten what the minibatches read: [T, N, ...] -> [T * N, ...]
        flat = {key: b[key].reshape(args.batch_size, *b[key].shape[2:]) for key in
                ("obs", "actions", "behaviour_logprobs", "advantages", "returns", "values")}

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

        # The actors pick up the new policy (it joins the buffer; the oldest snapshot drops out).
        policy_buffer.push(agent.actor)

        sps = progress.update(global_step, recent_returns, lag=ages.mean(), last=iteration == num_iterations)
        writer.add_scalar("charts/learning_rate", lr.item(), global_step)
        for name, values_list in stats.items():  # means over all minibatches of the update
            writer.add_scalar(f"losses/{name}", torch.stack(values_list).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_variance(b["values"], b["returns"]), global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        if stop.after(iteration, stats, params):  # a signal came, or a loss or weight is no longer finite
            break
        if args.save_model and args.checkpoint_every and iteration % args.checkpoint_every == 0 \
                and iteration < num_iterations:
            save_checkpoint(f"runs/{run_name}/{args.exp_name}_step{global_step}.cleanrl_model",
                            checkpoint_of(saved, global_step, iteration, args))

    envs.close()
    finish(args, saved, run_name, global_step, iteration, writer, stop)  # the checkpoint, evaluation, or why it stopped


# ==================================== run management ====================================
# Input checks, compile or not, checkpoints, resume, evaluation, logs, progress: main calls each in one line.


def check_args(args: Args):
    """Reject bad input with one line that names the problem (raised as SystemExit: no traceback). Returns the
    checkpoint of --resume (or None), once the run is shown to keep the settings it was trained with."""
    checkpoint = load_checkpoint(args.resume) if args.resume else None
    sitting = {"total_timesteps", "exp_name", "track", "wandb_project_name", "wandb_entity", "capture_video",
               "save_model", "eval_episodes", "checkpoint_every", "resume", "compile", "num_envs", "num_steps",
               "num_minibatches"}  # what a resumed run may change: its length, name, logs, checkpoints and layout
    for name, value in checkpoint["args"].items() if checkpoint else ():
        if name not in sitting and getattr(args, name) != value:
            sys.exit(f"error: --{name.replace('_', '-')} {getattr(args, name)} differs from {value}, the value "
                     f"{args.resume} was trained with: a resumed run keeps its own settings (leave the option out)")
    ranges = dict(  # every numeric option: the interval of values it takes
        total_timesteps="[1, inf)", num_envs="[1, inf)", num_steps="[1, inf)", num_minibatches="[1, inf)",
        update_epochs="[1, inf)", policy_buffer="[1, inf)", learning_rate="(0, inf)", max_grad_norm="(0, inf)",
        clip_coef="(0, inf)", target_kl="(0, inf)", gamma="[0, 1]", gae_lambda="[0, 1]",
        ent_coef="[0, inf)", vf_coef="[0, inf)", eval_episodes="[0, inf)", checkpoint_every="[0, inf)",
        seed="[0, 4294967295]", epsilon="(0, inf)")
    for name, interval in ranges.items():  # "[" and "]" include their bound, "(" and ")" leave it out
        value, (low, high) = getattr(args, name), map(float, interval[1:-1].split(","))
        if value is not None and not (low < value < high or value == low and interval[0] == "["
                                      or value == high and interval[-1] == "]"):
            sys.exit(f"error: --{name.replace('_', '-')} must be in {interval}, got {value}")
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
                                 "policy_buffer", "generator", "action_generator", "lag_rng") if part not in checkpoint]
    if missing:
        sys.exit(f"error: {path}: a checkpoint of {script} without its {', '.join(missing)}")
    return checkpoint


def checkpoint_of(saved, global_step, iteration, args):
    """Everything a resumed run needs, of the objects in `saved`, as tensors and plain numbers."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init}
    return {"script": os.path.basename(__file__), "args": options, "global_step": global_step, "iteration": iteration,
            "agent": saved["agent"].state_dict(), "optimizer": saved["optimizer"],
            "obs_rms": rms_state(saved["obs_rms"]), "reward_rms": rms_state(saved["reward_rms"]),
            "policy_buffer": [snapshot.state_dict() for snapshot in saved["policy_buffer"].snapshots],  # oldest first
            "generator": saved["generator"].get_state(), "action_generator": saved["action_generator"].get_state(),
            "lag_rng": saved["lag_rng"].bit_generator.state}


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
    buffer, snapshot = saved["policy_buffer"], copy.deepcopy(saved["policy_buffer"][0])
    buffer.snapshots.clear()  # the saved snapshots, oldest first, replace it (the initial policy is among them)
    for state in checkpoint["policy_buffer"]:
        snapshot.load_state_dict(state)
        buffer.push(snapshot)  # a frozen copy
    saved["generator"].set_state(checkpoint["generator"])
    saved["action_generator"].set_state(checkpoint["action_generator"])
    saved["lag_rng"].bit_generator.state = checkpoint["lag_rng"]
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


def finish(args, saved, run_name, global_step, iteration, writer, stop):
    """The end of a run: its checkpoint (with --save-model), its evaluation. After a signal, a checkpoint anyway, the
    command that resumes it and exit 130 (Ctrl-C) or 143 (SIGTERM); after a divergence, none (the earlier ones stay)."""
    path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
    if (args.save_model or stop.signal) and not stop.diverged:
        save_checkpoint(path, checkpoint_of(saved, global_step, iteration, args))
    if args.save_model and not (stop.signal or stop.diverged):
        evaluate(saved, args, writer)
    writer.close()
    if args.track:
        import wandb

        wandb.finish()
    if stop.diverged:
        sys.exit(f"error: {stop.diverged}: the run stopped (its checkpoints before it, if any: runs/{run_name})")
    if stop.signal:
        print(f"stopped at step {global_step}; continue with: python {os.path.basename(__file__)} --resume {path}")
        sys.exit(128 + stop.signal)


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
    args = tyro.cli(Args)
    if args.resume:  # a resumed run: the checkpoint's options are the defaults, so that one left out changes nothing
        args = tyro.cli(Args, default=Args(**load_checkpoint(args.resume)["args"]))
    main(args)
