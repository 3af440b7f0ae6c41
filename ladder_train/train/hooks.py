"""What the trainer runs beside training: the validation loss every ``eval.val_every`` steps, and the
lm-eval evaluation of the final (and every ``eval.every``-th) checkpoint."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..model import Transformer


def validation(trainer) -> dict | None:
    """Token-weighted validation loss over the same first ``eval.val_batches`` batches of each rank's part
    of the validation split of ``data.validation_source`` (default: of ``data.source``); every rank runs
    the same number of forwards (FSDP needs that)."""
    from ..data import build_dataloader
    from ..evaluation import validation_loss

    cfg = trainer.cfg
    if trainer.tokenizer is None:  # fixed batches given by the caller (tests): no data source to hold out
        return None
    loader = build_dataloader(
        cfg.data,
        tokenizer=trainer.tokenizer,
        batch_size=trainer.plan.micro_batch,
        dp_rank=trainer.env.rank,
        dp_world_size=trainer.env.world_size,
        seed=cfg.run.seed,
        source=cfg.data.validation_source or cfg.data.source,
        split="validation",
        num_workers=0,
        cycle=True,
    )
    batches = (batch for _, batch in zip(range(cfg.eval.val_batches), loader, strict=False))
    loss, count = validation_loss(trainer.model, batches)
    totals = torch.tensor([loss * count, float(count)], dtype=torch.float64, device=trainer.env.device)
    dist.all_reduce(totals)
    mean = (totals[0] / totals[1]).item()
    return {"step": trainer.step, "tokens": trainer.tokens_seen, "val_loss": mean, "val_ppl": math.exp(mean)}


def gather_full_model(trainer) -> Transformer | None:
    """The unsharded model on rank 0 (None elsewhere): a collective, every rank calls it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(trainer.model, options=options)
    if not trainer.env.is_main:
        return None
    with torch.device("meta"):
        model = Transformer(trainer.model_args)
    model.to_empty(device=trainer.env.device)
    model.init_rope()
    model.load_state_dict(state)
    return model.eval()


# how long the other ranks wait for rank 0's lm-eval (or export): the paper's seven tasks on a 3.5B model take
# longer than any sensible collective timeout; if rank 0 dies instead, torchrun ends the others
EVAL_WAIT = timedelta(hours=24)


def _eval_wait_group(trainer):
    """A gloo group over all ranks with a long timeout, created once per trainer (a collective: every rank
    calls it). Waiting on it keeps the default group's timeout (``parallel.timeout_s``) short."""
    group = getattr(trainer, "_eval_wait_group", None)
    if group is None:
        group = dist.new_group(backend="gloo", timeout=EVAL_WAIT)
        trainer._eval_wait_group = group
    return group


def evaluate_checkpoint(trainer, logger) -> dict | None:
    """Run the configured lm-eval tasks on the current weights: in this job (rank 0, the others wait on a
    gloo group with a long timeout), or as a separate Slurm job on an export of the newest checkpoint
    (``eval.mode=slurm``; the others wait for the export)."""
    cfg = trainer.cfg
    if trainer.tokenizer is None:  # batches given by the caller: no tokenizer to score eval text with
        if trainer.env.is_main:
            print("note: eval skipped: the trainer was given its batches, so it has no tokenizer", flush=True)
        return None
    out_path = trainer.run_dir / "eval" / f"step-{trainer.step}.json"
    wait_group = _eval_wait_group(trainer)
    if cfg.eval.mode == "slurm":
        if trainer.env.is_main:
            submit_eval_job(trainer, out_path)
        dist.barrier(group=wait_group)
        return None
    model = gather_full_model(trainer)
    results = None
    if trainer.env.is_main:
        from ..evaluation import evaluate, wandb_summary

        results = evaluate(
            model,
            trainer.tokenizer,
            list(cfg.eval.tasks),
            include_path=cfg.eval.include_path,
            limit=cfg.eval.limit,
            batch_size=cfg.eval.batch_size,
            out_path=out_path,
            local_data=cfg.eval.local_data,
            device=trainer.env.device,
        )
        summary = wandb_summary(results)
        logger.log({"step": trainer.step, **summary}, console=False)
        logger.summary(summary)
        print(f"eval results: {out_path}", flush=True)
    dist.barrier(group=wait_group)
    return results


def submit_eval_job(trainer, out_path: Path) -> None:
    from ..export import export_checkpoint

    checkpoint = trainer.checkpointer.folder / f"step-{trainer.step}"
    export_dir = trainer.run_dir / "export" / f"step-{trainer.step}"
    export_checkpoint(checkpoint, export_dir)
    if shutil.which("sbatch") is None:
        print(
            f"warning: eval.mode=slurm but sbatch is not on PATH; evaluate later with: sbatch slurm/eval.sh {export_dir}",
            file=sys.stderr,
        )
        return
    cmd = [
        "sbatch",
        "slurm/eval.sh",
        str(export_dir),
        "--tasks",
        ",".join(trainer.cfg.eval.tasks),
        "--out",
        str(out_path),
    ]
    for flag, value in (
        ("--include-path", trainer.cfg.eval.include_path),
        ("--local-data", trainer.cfg.eval.local_data),
    ):
        if value:
            cmd += [flag, value]
    print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip(), flush=True)
