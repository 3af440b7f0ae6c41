#!/usr/bin/env bash
# Shared launcher of the sbatch scripts: one srun task per node, each running torchrun over the node's
# GPUs, rendezvous (c10d) on the first node. Usage (from an sbatch script that sets RECIPE):
#   source slurm/launch.sh [key=value ...]
# LADDER_DRY_RUN=1 prints the plan (mesh, parameters and memory per GPU) for this allocation instead.
set -euo pipefail

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${SLURM_NNODES:-1}                      # the one place the node count comes from
export GPUS_PER_NODE
PYTHON=${PYTHON:-python}

if [[ "${LADDER_DRY_RUN:-0}" == 1 ]]; then
    exec "$PYTHON" -m ladder_train.train --config "$RECIPE" --dry-run --simulate "${NNODES}x${GPUS_PER_NODE}" "$@"
fi

HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export WANDB_RUN_GROUP=${WANDB_RUN_GROUP:-$SLURM_JOB_NAME}
# Slurm sends SIGUSR1 before the time limit (--signal=USR1@120); srun forwards it to torchrun's workers,
# which save a checkpoint; the job is then requeued and resumes from it (checkpointing: issue 5).
srun --kill-on-bad-exit=1 --ntasks-per-node=1 \
    "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:29500" --rdzv-id "$SLURM_JOB_ID" \
    -m ladder_train.train --config "$RECIPE" "$@"
