#!/usr/bin/env bash
# Pretrain a 1.2B model (standard, parallel or ladder) with HSDP: FSDP over a node's 8 GPUs, replicas across nodes.
#   sbatch slurm/pretrain_1b.sh                           # standard layout, 4 nodes
#   sbatch -N 8 slurm/pretrain_1b.sh recipes/ladder_1b.yaml train.micro_batch_size=4
#   LADDER_DRY_RUN=1 SLURM_NNODES=4 bash slurm/pretrain_1b.sh   # print the plan, no GPUs needed
#SBATCH --job-name=ladder-1b
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
# the log goes to the submit directory: Slurm opens --output before the script runs, so a folder the
# script would create (logs/) does not exist yet on the first submission from a fresh clone
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
RECIPE=recipes/standard_1b.yaml
if [[ $# -gt 0 && "$1" == *.yaml ]]; then RECIPE=$1; shift; fi
source slurm/launch.sh "$@"
