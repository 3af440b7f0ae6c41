#!/usr/bin/env bash
# A short GPU lease's worth of the project's GPU checks, each part one device call of under 10 minutes, on a bare,
# offline machine that received the checkout with .gpu/ (bash benchmarks/gpu_prepare.sh):
#   OUT=DIR bash benchmarks/gpu_lease.sh check    # ours against the peers, one gpu_check invocation: ceilings,
#                                                 # standard at micro-batches 2 and 8, torchtitan and the bare loop at
#                                                 # the same, whole-1.2B decode (GEMV tuning on) and transformers'
#                                                 # decode of the same model
#   OUT=DIR bash benchmarks/gpu_lease.sh levers   # the settings still to be paid for, each beside its absence: the
#                                                 # loss alone eager against compiled (loss_ab, at most LOSS_S),
#                                                 # FSDP units of 4 against 1 at micro-batches 2 and 8 (+ micro-batch
#                                                 # 2 profiled), whole-1.2B decode with GEMV tuning on and off
#   OUT=DIR bash benchmarks/gpu_lease.sh study    # the small study's seeds in bf16, 8 at once, as many as start
#                                                 # within STUDY_S (~5 min with the defaults): standard at 8e-3, the
#                                                 # ladder at 8e-3 and at 4e-3, seed by seed
# check and levers have not been timed whole; their parts' wall times are in docs/results/gpu/h200_2026-11-28.jsonl
# (a 1.2B training run 26-46 s, a variant's 72-91 s, the profiled run 36 s, whole-1.2B decode 107 s, each one run);
# each call takes timeout_s 590.
# tests/test_gpu_check.py runs `check` with TINY=1 and its own CHECK.
# Each writes at most 7 files under OUT (the device tool brings back 8). Knobs: LOSS_S (60) and CHECK_S (gpu_check's
# outer limit: 520 after loss_ab, 570 without); CHECK (gpu_check's arguments); STUDY_S (180; a call of timeout_s
# 450); PYTHON (python3); SEEDS (3,4,5,6,7,8,9,10); TINY=1 (the CPU at tiny sizes: a check of this script).
# The exit status is gpu_check's (gpu_study's for study; loss_ab's where it failed and gpu_check did not), not tee's.
# Back here: append gpu.jsonl to docs/results/gpu/CARD_DATE.jsonl (loss_ab.jsonl beside it); study.tgz holds the
# finished runs as the study runner collects them (for docs/results/study_small/); remake the tables.
set -u
PYTHON=${PYTHON:-python3}
PART=${1:?usage: OUT=DIR bash benchmarks/gpu_lease.sh check|levers|study}
OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export PYTHONUNBUFFERED=1
# the wheels a bare machine lacks (.gpu/whl, from gpu_prepare.sh) before any part imports them
if [ -z "${TINY:-}" ] && ls .gpu/whl/*.whl > /dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site \
    .gpu/whl/*.whl || { echo "gpu_lease: pip could not install .gpu/whl" >&2; exit 2; }
  export PYTHONPATH="$PWD/.gpu/site${PYTHONPATH:+:$PYTHONPATH}"
fi
SEEDS=${SEEDS:-3,4,5,6,7,8,9,10}
STATUS=0  # the parts' exit status, carried past the pipes into tee and the copies after them
case "$PART" in
  check|levers)
    nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1 || echo "no nvidia-smi here" > "$OUT/nvidia_smi.txt"
    if [ -n "${TINY:-}" ]; then
      TINY_CHECK="--tiny --layouts standard --decode-layers 2 --peers"
      TINY_LEVERS="--tiny --layouts standard --variant parallel.blocks_per_fsdp_unit=2 --profile --keep-trace --decode-layers 2"
      [ "$PART" = check ] && DEFAULT=$TINY_CHECK || DEFAULT=$TINY_LEVERS
      LOSS=(--tokens 512 --dim 8 --vocab 4096 --rounds 1 --calls 2)
    else
      GPU_CHECK="--layouts standard --micro 2,8 --steps 12 --decode-layers 40 --gemv-tuning on --peers"
      GPU_LEVERS="--layouts standard --micro 2,8 --steps 12 --variant parallel.blocks_per_fsdp_unit=4 --profile --keep-trace --decode-layers 40"
      [ "$PART" = check ] && DEFAULT=$GPU_CHECK || DEFAULT=$GPU_LEVERS
      LOSS=(--device cuda --tokens 16384 --dim 2048 --rounds 3 --calls 5)
    fi
    read -r -a ARGS <<< "${CHECK:-$DEFAULT}"
    : > "$OUT/check.log"
    LIMIT=${CHECK_S:-570}
    if [ "$PART" = levers ]; then
      timeout -s TERM "${LOSS_S:-60}" "$PYTHON" -m benchmarks.loss_ab "${LOSS[@]}" --out "$OUT/loss_ab.jsonl" \
        2>&1 | tee -a "$OUT/check.log"
      STATUS=${PIPESTATUS[0]}
      LIMIT=${CHECK_S:-520}
    fi
    timeout -s TERM "$LIMIT" "$PYTHON" -m benchmarks.gpu_check --out "$W/check" "${ARGS[@]}" 2>&1 \
      | tee -a "$OUT/check.log"
    CHECK_STATUS=${PIPESTATUS[0]}
    [ "$CHECK_STATUS" -ne 0 ] && STATUS=$CHECK_STATUS
    cp "$W/check/gpu.jsonl" "$OUT/" 2>/dev/null
    mv "$W"/check/logs/*/*.trace.json.gz "$OUT/" 2>/dev/null
    tar czf "$OUT/check_logs.tgz" -C "$W/check" logs 2>/dev/null
    ;;
  study)
    ARGS=(--jobs 8)
    if [ -n "${TINY:-}" ]; then
      ARGS=(--tiny --jobs 2 --set train.max_steps=2 --set train.schedule.warmup_steps=1 --set train.schedule.total_steps=2
            --set eval.val_every=2 --set eval.val_batches=1 --set eval.at_end=false --set data.num_workers=0)
    fi
    # a point that started runs to its end: the outer limit leaves it 4 minutes after the budget
    timeout -s TERM $(( ${STUDY_S:-180} + 240 )) "$PYTHON" -m benchmarks.gpu_study --out "$W/study" \
      --budget-s "${STUDY_S:-180}" \
      --study "recipes/study_small.yaml model.residual=standard train.optimizer.lr=8e-3 run.seed=$SEEDS run.dir=runs/gpu_seeds" \
      --study "recipes/study_small.yaml model.residual=ladder train.optimizer.lr=8e-3 run.seed=$SEEDS run.dir=runs/gpu_seeds" \
      --study "recipes/study_small.yaml model.residual=ladder train.optimizer.lr=4e-3 run.seed=$SEEDS run.dir=runs/gpu_seeds" \
      "${ARGS[@]}" > "$OUT/study.log" 2>&1
    STATUS=$?
    tail -25 "$OUT/study.log"
    tar czf "$OUT/study.tgz" -C "$W" study 2>/dev/null
    ;;
  *)
    echo "gpu_lease: PART is check, levers or study, got $PART" >&2
    exit 2
    ;;
esac
ls -la "$OUT"
exit "$STATUS"
