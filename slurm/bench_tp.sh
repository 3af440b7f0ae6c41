#!/bin/bash
# The paper's inference sweep on one 8-GPU node: TP 1, 2, 4, 8 x batch 1, 4, 16, 64, prompt 1024, 512 new
# tokens, standard / parallel / ladder, with NCCL P2P on and off (NCCL_P2P_DISABLE=1 = "no fast interconnect").
#
#   sbatch slurm/bench_tp.sh [MODEL] [extra ladder-bench arguments]
#   sbatch slurm/bench_tp.sh 3.5B-32h                  # default MODEL: 1.2B (random weights: speed only)
#   sbatch slurm/bench_tp.sh runs/ladder_1b/export     # an export folder (its own layout)
#   sbatch slurm/bench_tp.sh runs/ladder_1b/checkpoints/step-100000   # or a training checkpoint
#
# Results are appended as JSON lines to bench-tp-<jobid>.jsonl, one object per measurement, each naming
# TP, batch, layout, NCCL_P2P_DISABLE, the GPU, torch and NCCL versions. The decode step is compiled with
# CUDA graphs (torch.compile, with the prefill) automatically on GPUs.
#SBATCH --job-name=ladder-bench-tp
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
#SBATCH --time=08:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

MODEL=${1:-1.2B}
shift || true

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
if [[ -f .venv/bin/activate ]]; then
    source .venv/bin/activate
fi
OUT=${OUT:-bench-tp-${SLURM_JOB_ID:-local}.jsonl}
echo "ladder-bench sweep on $(hostname): model ${MODEL}, results in ${OUT}"

for p2p_disable in 0 1; do
    for tp in 1 2 4 8; do
        echo "=== TP=${tp} NCCL_P2P_DISABLE=${p2p_disable} ==="
        NCCL_P2P_DISABLE=${p2p_disable} torchrun --standalone --nproc-per-node "${tp}" \
            -m ladder_train.bench --model "${MODEL}" \
            --layouts standard,parallel,ladder --batch-sizes 1,4,16,64 \
            --prompt-len 1024 --gen-len 512 --warmup 1 --runs 3 --out "${OUT}" "$@"
    done
done
