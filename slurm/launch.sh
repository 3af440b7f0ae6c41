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
# Diagnostics for hangs and crashes: NCCL warnings (not its INFO flood), Python tracebacks of every thread on
# a fatal signal, and the NCCL flight recorder: each rank keeps its last 2000 collectives and dumps them when
# one times out, into the submit directory (the default /tmp is node-local and gone with the job).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export PYTHONFAULTHANDLER=${PYTHONFAULTHANDLER:-1}
export TORCH_NCCL_TRACE_BUFFER_SIZE=${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}
export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
if [[ -z "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-}" ]]; then
    mkdir -p "nccl-trace-${SLURM_JOB_ID}"
    export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$PWD/nccl-trace-${SLURM_JOB_ID}/rank_"
fi
export WANDB_RUN_GROUP=${WANDB_RUN_GROUP:-$SLURM_JOB_NAME}
# Cross-node gloo groups (the eval wait group, CPU collectives) and NCCL's bootstrap pick a network interface by
# themselves; on nodes with several (ethernet + InfiniBand, docker bridges) name it: GLOO_SOCKET_IFNAME=ib0 and
# NCCL_SOCKET_IFNAME=ib0 (or =^docker,lo to exclude), exported before sbatch; Slurm passes the environment on.
# srun does not inherit sbatch's --cpus-per-task (Slurm 22.05 and later): pass it, or each task gets one CPU and
# the loader workers and torchrun's eight ranks share it.
CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}
export SRUN_CPUS_PER_TASK=$CPUS_PER_TASK

# Preemption: sbatch's --signal=B:USR1@120 reaches this shell before the time limit. It is passed on to
# srun, which forwards it to torchrun, which forwards it to the workers (--signals-to-handle); each worker
# finishes its step, saves a checkpoint and exits. The job is then requeued and auto-resumes from it.
# torchrun then waits SHUTDOWN_TIMEOUT_S for the workers before it kills them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
# read by torch releases with torchrun's --shutdown-timeout, 2.13 among them; older ones keep a fixed 30 s). Keep it
# below the --signal lead time, which must cover a step plus the save: `sbatch --signal=B:USR1@300 ...` with
# SHUTDOWN_TIMEOUT_S=280 for a larger model. The regular checkpoint.every saves bound what a cut save loses.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT_S:-100}
REQUEUE=0
trap 'REQUEUE=1; kill -USR1 "$SRUN_PID" 2>/dev/null' USR1 TERM
srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task "$CPUS_PER_TASK" \
    "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$HEAD_NODE:29500" --rdzv-id "$SLURM_JOB_ID" \
    --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    -m ladder_train.train --config "$RECIPE" "$@" &
SRUN_PID=$!
status=0
wait "$SRUN_PID" || status=$?
if [[ "$REQUEUE" == 1 ]]; then
    wait "$SRUN_PID" 2>/dev/null || true   # the first wait returns when the trap fires
    echo "preempted: requeueing job $SLURM_JOB_ID; it resumes from the newest checkpoint in run.dir"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
exit "$status"
