"""Why one actor's death could take a healthy actor with it in vaco_async.py, reproduced in a few seconds.

The learner handed its settings to the actors with one collective, `broadcast_object_list`. gloo's
broadcast is a binomial tree: with a learner (rank 0) and three actors, rank 0 sends to rank 1,
then ranks 0 and 1 send to ranks 2 and 3, so actor 3's start-up message is relayed by actor 1. The
root returns once its own sends are written, so the learner printed "actor(s) joined" and a test
(or an out-of-memory kill) could end actor 1 before it had relayed: actor 3's receive then failed
with "Connection closed by peer" from actor 1's address, and actor 3 exited. Under load the relay
is late more often, hence a rare failure on a busy machine.

This script makes the race certain. Actor 3 is slow to take its message (2 s: a loaded core), and
the learner kills actor 1 as soon as its hand-out returns, as the fault test does on "joined".
Each healthy rank reports whether its start-up message arrived.

    python benchmark/asynchrony/gloo_startup_race.py                 # both hand-outs, 3 repeats each
    python benchmark/asynchrony/gloo_startup_race.py --handout p2p   # the point-to-point hand-out vaco_async.py uses

Measured here (8 trials each, two busy cores): with `broadcast`, actor 3 lost its message in 2 of 8
("Read error" from a peer: actor 1's relay killed before actor 3 read it; when the relay's bytes
were already in actor 3's socket, it got them); with `p2p`, as vaco_async.py now hands out its
settings, in 0 of 8.
"""

import argparse
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
import vaco_async  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world_size, port, handout, results):
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=20))
    results[f"pid{rank}"] = os.getpid()
    store.set(f"ready{rank}", "1")
    store.wait([f"ready{r}" for r in range(world_size)])
    if rank == 3:
        time.sleep(2.0)  # a slow actor: it posts its receive late
    settings = vaco_async.Args(seed=1)
    expected = ["run", vars(settings), None]  # vaco_async.py's start-up message: run name, settings, noise state
    message = list(expected) if rank == 0 else [None, None, None]
    try:
        if handout == "broadcast":  # the collective vaco_async.py used to hand them out with
            dist.broadcast_object_list(message, src=0)
        elif rank == 0:  # its hand-out now: one message to each actor, from the learner
            vaco_async.hand_out_settings(world_size, "run", settings, {})
        else:  # as each actor takes it (`actor_process`)
            dist.recv_object_list(message, src=0)
        results[rank] = "ok" if message == expected else f"wrong message {message}"
    except RuntimeError as error:
        results[rank] = str(error).splitlines()[0][:100]
    if rank == 0:
        os.kill(results["pid1"], signal.SIGKILL)  # "joined": actor 1 is killed at once
        time.sleep(4.0)  # the learner carries on meanwhile
    elif rank == 1:
        time.sleep(10.0)  # killed by then
    os._exit(0)  # skip the group's teardown: a peer is gone


def trial(handout, world_size=4):
    port = free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        procs = [mp.get_context("spawn").Process(target=rank_main, args=(r, world_size, port, handout, results))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        return {r: results.get(r, "no answer (hung or died)") for r in [0] + list(range(2, world_size))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--handout", choices=["broadcast", "p2p", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.repeats < 1:
        sys.exit(f"error: --repeats must be >= 1, got {args.repeats}")
    failures = {}
    for handout in (["broadcast", "p2p"] if args.handout == "both" else [args.handout]):
        failures[handout] = 0
        for i in range(args.repeats):
            outcome = trial(handout)
            failed = {r: o for r, o in outcome.items() if o != "ok"}
            failures[handout] += bool(failed)
            print(f"{handout} #{i + 1}: " + ", ".join(f"{'learner' if r == 0 else f'actor {r}'}: {o}"
                                                      for r, o in outcome.items()), flush=True)
    for handout, n in failures.items():
        print(f"{handout}: a healthy actor failed in {n} of {args.repeats} trials")


if __name__ == "__main__":
    main()
