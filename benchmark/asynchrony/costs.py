"""The three costs that set vaco_async.py's throughput, measured one at a time on this machine,
and what they predict for more actors and more cores.

- t_act: seconds an actor takes for one env step of a segment (acting with the policy, stepping the
  envs, normalising), from `collect_rollout` on one core;
- t_learn: seconds the learner takes for one update of a batch (V-trace + the compiled minibatch
  steps, 32 minibatches x 10 epochs), per env step of the batch;
- t_msg: seconds to move one segment from an actor to the learner through gloo on loopback, per
  env step (and the weights message once per update).

With N actors on their own cores and a learner on another, the env steps/s are
min(N / t_act, 1 / t_learn, 1 / t_msg): actors add throughput until the learner saturates at
N* = t_act / t_learn actors; past it they wait (backpressure) and the lag grows towards
1 + --queue-batches versions.

    python benchmark/asynchrony/costs.py --env-id HalfCheetah-v4
"""

import datetime
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import vaco_async as va  # noqa: E402


@dataclass
class Args:
    env_id: str = "HalfCheetah-v4"
    """the MuJoCo task"""
    num_envs: int = 8
    """envs per actor in the measurement (the script's default batch: 8 x 256)"""
    num_steps: int = 256
    """steps per segment"""
    repeats: int = 5
    """repeats of each measurement; medians are reported"""
    messages: int = 50
    """segments sent per message-time repeat"""
    layouts: list[str] = field(default_factory=lambda: ["2:1", "2:2", "16:15", "64:63"])
    """predictions for CORES:ACTORS (one node; the learner takes a core of its own when there is one)"""
    network_gbps: float = 10.0
    """the network between nodes, for the prediction across nodes"""


def actor_time(args):
    """Seconds per env step of one actor collecting segments (after one warm-up segment)."""
    envs = va.make_envs(va.Args(env_id=args.env_id, num_envs=args.num_envs), run_name="costs")
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    layout = va.SegmentLayout(args.num_steps, args.num_envs, obs_dim, act_dim)
    segment = layout.views(torch.zeros(layout.size, dtype=torch.float64))
    actor, obs_rms, generator = va.Actor(obs_dim, act_dim).requires_grad_(False), va.RunningMeanStd(shape=(obs_dim,)), torch.Generator()
    raw_obs, _ = envs.reset(seed=0)
    obs_rms.update(raw_obs)
    current = va.normalize_obs(raw_obs, obs_rms)
    times = []
    for repeat in range(args.repeats + 1):
        start = time.perf_counter()
        current = va.collect_rollout(envs, actor, obs_rms, current, segment, generator)
        times.append((time.perf_counter() - start) / layout.steps)
    envs.close()
    return statistics.median(times[1:]), layout, obs_dim, act_dim


def learner_time(args, layout, obs_dim, act_dim):
    """Seconds per env step of one update (advantages, then the compiled minibatch steps), the
    compile left out; and how long the compile took."""
    script_args = va.Args(env_id=args.env_id, num_envs=args.num_envs, num_steps=args.num_steps)
    script_args.batch_size = layout.steps
    script_args.minibatch_size = layout.steps // script_args.num_minibatches
    agent = va.Agent(obs_dim, act_dim)
    params = {name: p.detach() for name, p in agent.named_parameters()}
    adam, lr = va.adam_state(params), torch.tensor(3e-4)
    update = torch.compile(va.train_step, fullgraph=True)  # as the script's main compiles it
    T, n = args.num_steps, args.num_envs
    b = dict(obs=torch.randn(T, n, obs_dim), next_obs=torch.randn(T, n, obs_dim), actions=torch.randn(T, n, act_dim),
             behaviour_logprobs=torch.randn(T, n) - act_dim, rewards=torch.randn(T, n), terminations=torch.zeros(T, n),
             dones=torch.zeros(T, n))
    generator = torch.Generator().manual_seed(0)

    def one_update():
        batch = {**b, **va.estimate_advantages(agent, b, script_args)}
        flat = {key: batch[key].reshape(layout.steps, *batch[key].shape[2:])
                for key in ("obs", "actions", "behaviour_logprobs", "advantages", "returns", "values",
                            "proximal_logprobs")}
        for _ in range(script_args.update_epochs):
            indices = torch.randperm(layout.steps, generator=generator)
            for start in range(0, layout.steps, script_args.minibatch_size):
                update(params, adam, flat, indices[start : start + script_args.minibatch_size], lr, agent, script_args)

    start = time.perf_counter()
    one_update()  # compiles
    compile_time = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        one_update()
        times.append((time.perf_counter() - start) / layout.steps)
    return statistics.median(times), compile_time


def _receiver(rank, port, size, count):
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    message = torch.zeros(size, dtype=torch.float64)
    for _ in range(count):
        dist.send(message, dst=0, tag=3)
    dist.recv(torch.zeros(1), src=0, tag=9)  # the learner is done timing
    dist.destroy_process_group()


def message_time(size, count, repeats):
    """Seconds to receive one float64 message of `size` values from another process (loopback)."""
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    process = mp.get_context("spawn").Process(target=_receiver, args=(1, store.port, size, count * repeats))
    process.start()
    dist.init_process_group("gloo", store=store, rank=0, world_size=2, timeout=datetime.timedelta(seconds=60))
    buffer, times = torch.empty(size, dtype=torch.float64), []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            dist.recv(buffer, src=None, tag=3)
        times.append((time.perf_counter() - start) / count)
    dist.send(torch.zeros(1), dst=1, tag=9)
    process.join()
    dist.destroy_process_group()
    return statistics.median(times)


def main(args: Args):
    torch.set_num_threads(1)
    t_act, layout, obs_dim, act_dim = actor_time(args)
    t_learn, compile_time = learner_time(args, layout, obs_dim, act_dim)
    t_msg = message_time(layout.size, args.messages, args.repeats) / layout.steps
    print(f"{args.env_id}, segments of {args.num_envs} envs x {args.num_steps} steps ({layout.size * 8 / 1e6:.2f} MB), "
          f"medians of {args.repeats}")
    print(f"  t_act   {t_act * 1e6:7.1f} us per env step  (one actor: {1 / t_act:7.0f} env steps/s)")
    print(f"  t_learn {t_learn * 1e6:7.1f} us per env step  (learner:   {1 / t_learn:7.0f} env steps/s; compile {compile_time:.1f} s)")
    print(f"  t_msg   {t_msg * 1e6:7.1f} us per env step  (messages:  {1 / t_msg:7.0f} env steps/s)")
    print(f"  the learner saturates at N* = t_act / t_learn = {t_act / t_learn:.2f} actors")
    print("\npredicted env steps/s = min(N / t_act, 1 / t_learn, 1 / t_msg, C / (t_act + t_learn + t_msg)):")
    for layout_ in args.layouts:
        cores, actors = map(int, layout_.split(":"))
        bounds = {"actors": actors / t_act, "learner": 1 / t_learn, "messages": 1 / t_msg,
                  "cores": cores / (t_act + t_learn + t_msg)}
        bound = min(bounds, key=bounds.get)
        print(f"  {cores:3d} cores, {actors:3d} actors: {bounds[bound]:7.0f}, bound by the {bound}")
    network = layout.size * 8 / layout.steps / (args.network_gbps * 1.25e8)  # seconds per env step on the wire
    print(f"  across nodes at {args.network_gbps:g} Gbit/s: messages alone allow {1 / network:.0f} env steps/s")
    print(f"\nthe synchronous script on one core: 1 / (t_act + t_learn) = {1 / (t_act + t_learn):.0f} env steps/s")


if __name__ == "__main__":
    main(tyro.cli(Args))
