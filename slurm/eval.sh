#!/bin/bash
# Evaluate an exported model (model.safetensors + config.json) with lm-eval on one GPU.
#
#   sbatch slurm/eval.sh EXPORT_DIR [extra ladder-eval arguments]
#   sbatch slurm/eval.sh runs/ladder_1b/export --tasks arc_easy,piqa --out runs/ladder_1b/eval/step-25000.json
#
# Without --tasks the paper's tasks run (arc_challenge, arc_easy, hellaswag, piqa, sciq, winogrande, wikitext).
# A cluster without internet: --local-data DIR with the *_local tasks, or --include-path DIR with your own
# task YAMLs; set HF_DATASETS_OFFLINE=1 so nothing waits on the network. A training checkpoint
# (RUN_DIR/checkpoints/step-N) is accepted too: ladder-eval reads it directly, with the run's tokenizer.
#SBATCH --job-name=ladder-eval
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: sbatch slurm/eval.sh EXPORT_DIR [ladder-eval arguments]" >&2
    exit 2
fi
EXPORT_DIR=$1
shift

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
# the project's virtualenv when there is one, else whatever python environment the job inherits
if [[ -f .venv/bin/activate ]]; then
    source .venv/bin/activate
fi

echo "ladder-eval on $(hostname): ${EXPORT_DIR} $*"
srun --cpus-per-task "${SLURM_CPUS_PER_TASK:-1}" ladder-eval "${EXPORT_DIR}" --device cuda "$@"  # srun does not inherit it
