#!/usr/bin/env bash
# One point of a study per array task (ladder-train study ... --dry-run prints the points and this line):
#   sbatch --array=0-11 slurm/study.sh recipes/study_small_lr.yaml model.residual=standard,parallel,ladder \
#       train.optimizer.lr=2e-3,4e-3,8e-3,1.6e-2 run.dir=runs/study/lr
#   LADDER_DRY_RUN=1 SLURM_ARRAY_TASK_ID=3 bash slurm/study.sh ...   # point 3's plan, no GPUs needed
# A task whose point finished already exits at once; a requeued or resubmitted one resumes its checkpoint.
#SBATCH --job-name=ladder-study
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --output=slurm-%x-%A_%a.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
RECIPE=${1:?usage: sbatch --array=0-N slurm/study.sh RECIPE key=a,b ...}
shift
POINT=${SLURM_ARRAY_TASK_ID:?submit with sbatch --array=0-N (ladder-train study --config RECIPE ... --dry-run gives N)}
PYTHON=${PYTHON:-python}
POINT_ARGS=$("$PYTHON" -m ladder_train.cli study --config "$RECIPE" "$@" --point "$POINT")
mapfile -t POINT_ARGS <<< "$POINT_ARGS"
source slurm/launch.sh "${POINT_ARGS[@]}"
