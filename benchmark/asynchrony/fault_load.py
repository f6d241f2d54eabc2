"""vaco_async.py's fault tests, many times over, on a loaded machine: the check that one actor's death
never takes a healthy actor with it, however the processes are scheduled.

    python benchmark/asynchrony/fault_load.py                      # 20 runs of each test, every core busy
    python benchmark/asynchrony/fault_load.py --repeats 5 --busy 0 --no-churn   # a quick look on a quiet machine

For each repeat, each fault test runs in a pytest process of its own. Meanwhile:
- `--busy` busy-looping Python processes (default: one per core) keep every core busy, niced to 19 so
  that the tests keep their share (load slows the actors and widens every race, as a busy node does);
- with `--churn` (default on), other vaco_async.py runs start beside the tests, have an actor killed
  once they are running, and stop: another process group losing actors on the same machine.
Prints and writes (`--out`, JSON) the passes of each test, with the tail of every failure's output.
Every loop is bounded: `--repeats` runs per test, each under pytest's own timeouts and `--test-timeout`.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
from benchmark.common import ROOT  # noqa: E402

TESTS = {  # name: pytest node id (the kill test takes its four kill timings in turn)
    "kill": "tests/test_vaco_async.py::test_a_killed_actor_is_lost_and_the_run_goes_on_every_time[{attempt}]",
    "silent": "tests/test_vaco_async.py::test_a_silent_actor_is_dismissed_and_the_run_goes_on",
    "two_actors": "tests/test_vaco_async.py::test_two_actors_finish_with_lag_and_a_checkpoint",
}
CHURN = ["--env-id", "Hopper-v4", "--num-actors", "3", "--num-envs", "3", "--num-steps", "32", "--num-minibatches", "3",
         "--update-epochs", "2", "--total-timesteps", "100000", "--no-compile", "--actor-timeout", "3"]


def busy_loops(n):
    return [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def churn(stop, log):
    """Until `stop` is set: start a vaco_async.py run of 3 actors, kill one of its actors once it has
    joined, let it run a few seconds more, then stop it (SIGINT, then SIGKILL)."""
    while not stop.is_set():
        with tempfile.TemporaryDirectory() as folder:
            proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "vaco_async.py"), *CHURN], cwd=folder,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    start_new_session=True)
            deadline = time.time() + 60
            for line in proc.stdout:  # wait for "joined" (bounded by the deadline and the run's own end)
                if "joined" in line or time.time() > deadline or stop.is_set():
                    break
            actors = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                     text=True).stdout.split()]
            if actors:
                os.kill(random.choice(actors), signal.SIGKILL)
                log["kills"] += 1
            stop.wait(random.uniform(1, 4))
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log["runs"] += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="runs of each test")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy-looping processes (nice 19)")
    parser.add_argument("--churn", action=argparse.BooleanOptionalAction, default=True,
                        help="other vaco_async.py runs losing actors beside the tests")
    parser.add_argument("--tests", nargs="+", default=list(TESTS), choices=list(TESTS))
    parser.add_argument("--test-timeout", type=float, default=600, help="seconds for one test run")
    parser.add_argument("--out", default=None, help="a JSON file for the results")
    args = parser.parse_args()
    if args.repeats < 1 or args.busy < 0:
        sys.exit("error: --repeats must be >= 1 and --busy >= 0")
    loops, stop, churned = busy_loops(args.busy), threading.Event(), {"runs": 0, "kills": 0}
    thread = threading.Thread(target=churn, args=(stop, churned), daemon=True)
    if args.churn:
        thread.start()
    results = {name: {"passed": 0, "runs": 0, "failures": []} for name in args.tests}
    start = time.time()
    try:
        for repeat in range(args.repeats):
            for name in args.tests:
                node = TESTS[name].format(attempt=repeat % 4)
                try:
                    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", node], cwd=ROOT,
                                          capture_output=True, text=True, timeout=args.test_timeout)
                    passed, output = proc.returncode == 0, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as error:
                    passed, output = False, f"timed out after {args.test_timeout} s: {error}"
                results[name]["runs"] += 1
                results[name]["passed"] += passed
                if not passed:
                    results[name]["failures"].append(output[-3000:])
                print(f"[{time.time() - start:.0f} s] {name} #{repeat + 1}: {'passed' if passed else 'FAILED'}",
                      flush=True)
    finally:
        stop.set()
        for loop in loops:
            loop.kill()
        if args.churn:
            thread.join(60)
    summary = {"repeats": args.repeats, "busy": args.busy, "churn": churned if args.churn else None,
               "seconds": round(time.time() - start), "results": results}
    for name, r in results.items():
        print(f"{name}: {r['passed']}/{r['runs']} passed")
    if args.churn:
        print(f"beside them: {churned['runs']} other vaco_async.py runs, {churned['kills']} of their actors killed")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    sys.exit(0 if all(r["passed"] == r["runs"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
