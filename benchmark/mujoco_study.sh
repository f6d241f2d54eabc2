#!/usr/bin/env bash
# The 1M-step MuJoCo study of docs/ppo_continuous.md and docs/vaco_continuous.md: PPO and VACO,
# synchronous (K = 1) and lagged (K = 8), default flags otherwise. Each run uses one core; runs go
# JOBS at a time. Logs land in ./runs, then benchmark/report.py prints the table and draws the curves.
#   bash benchmark/mujoco_study.sh                 # seeds 1 2 3, JOBS=2
#   SEEDS="1" ENVS="HalfCheetah-v4" bash benchmark/mujoco_study.sh
#   SEEDS="1" EXTRA="--total-timesteps 4096" bash benchmark/mujoco_study.sh   # a dry run
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
SEEDS=${SEEDS:-"1 2 3"}
ENVS=${ENVS:-"Hopper-v4"}
JOBS=${JOBS:-2}
EXTRA=${EXTRA:-}
for env in $ENVS; do
  for seed in $SEEDS; do
    for algo in ppo vaco; do
      for k in 1 8; do
        echo "$here/${algo}_continuous.py --env-id $env --exp-name ${algo}_K$k --policy-buffer $k --seed $seed $EXTRA"
      done
    done
  done
done | xargs -P "$JOBS" -I{} sh -c 'python {} > /dev/null'
python "$here/benchmark/report.py" --runs-dir runs --plot mujoco_study.png
