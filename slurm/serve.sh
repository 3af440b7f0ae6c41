#!/bin/bash
# Serve a trained model with vLLM on one GPU node, at the tensor-parallel degree you give (every layout: standard,
# parallel, ladder, hybrids; a desync model only at its own desync_tp). The plugin (ladder_train/serve) is found
# through its entry point once ladder-train is installed beside vllm: pip install -e ".[serve]".
#
#   sbatch slurm/serve.sh EXPORT [TP] [extra vllm serve arguments]
#   sbatch slurm/serve.sh runs/ladder_1b/export/step-100000 8
#   sbatch slurm/serve.sh runs/ladder_1b/export/step-100000 8 --hf-overrides '{"ladder_overlap": true}'
#
# The server listens on PORT (default 8000) of the node; the job's output names the node. Ask it with
#   curl http://NODE:8000/v1/completions -H 'Content-Type: application/json' \
#        -d '{"model": "EXPORT", "prompt": "def add(a, b):", "max_tokens": 32, "temperature": 0}'
#SBATCH --job-name=ladder-serve
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --exclusive
#SBATCH --time=08:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

EXPORT=${1:?usage: sbatch slurm/serve.sh EXPORT [TP] [vllm serve arguments]}
TP=${2:-1}
shift 2 || shift || true

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
if [[ -f .venv/bin/activate ]]; then
    source .venv/bin/activate
fi
PORT=${PORT:-8000}
echo "vllm serve ${EXPORT} at TP ${TP} on $(hostname):${PORT}"
exec vllm serve "${EXPORT}" --tensor-parallel-size "${TP}" --host 0.0.0.0 --port "${PORT}" "$@"
