"""What the trainer runs beside training, and when: the validation loss every ``eval.val_every`` steps and at
the end, and the lm-eval evaluation of every ``eval.every``-th periodic checkpoint and of the final one. The
trainer offers every step (``maybe_validate``) and every checkpoint (``maybe_evaluate``); the evaluator decides."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..checkpoint import Checkpointer
from ..config import Config
from ..files import make_folder
from ..loading import model_from_state
from ..model import ModelArgs, Transformer
from ..parallel import RankEnv, together

EXPORTS = "export"  # RUN_DIR/export/step-N: eval.mode=slurm's export of checkpoint step-N, which its job evaluates
RESULTS = "eval"  # RUN_DIR/eval/step-N.json: the lm-eval results of checkpoint step-N


# how long the other ranks wait for rank 0's lm-eval (or export): the paper's seven tasks on a 3.5B model take
# longer than any sensible collective timeout; if rank 0 dies instead, torchrun ends the others
EVAL_WAIT = timedelta(hours=24)


@dataclass
class Evaluator:
    """Decides which steps are its own and evaluates the trainer's (sharded) model there. ``tokenizer`` is
    None when the trainer was given fixed batches (tests): nothing to hold out or to score text with."""

    cfg: Config
    env: RankEnv
    run_dir: Path
    model_args: ModelArgs
    micro_batch: int
    tokenizer: object | None
    _wait_group: object | None = None
    _validated_step: int | None = None

    # when --------------------------------------------------------------------------------------------

    def should_validate(self, step: int, last: bool = False) -> bool:
        """Every ``eval.val_every``-th step, and the last one (once)."""
        val_every = self.cfg.eval.val_every
        return bool(val_every) and (step % val_every == 0 or last) and self._validated_step != step

    def should_evaluate(self, step: int, last: bool = False) -> bool:
        """The final checkpoint with ``eval.at_end`` (and tasks to run), and every ``eval.every``-th periodic one."""
        if last:
            return self.cfg.eval.at_end and bool(self.cfg.eval.tasks)
        return bool(self.cfg.eval.every) and (step // self.cfg.checkpoint.every) % self.cfg.eval.every == 0

    def maybe_validate(self, model, step: int, tokens: int, logger, last: bool = False) -> None:
        """After step ``step`` (``last``: the run's last): the validation loss when it is due."""
        if self.should_validate(step, last):
            self.validate(model, step, tokens, logger)

    def maybe_evaluate(self, model, step: int, logger, checkpointer: Checkpointer, last: bool = False) -> None:
        """After the checkpoint of step ``step`` is saved (``last``: the final one): lm-eval when it is due."""
        if self.should_evaluate(step, last):
            checkpointer.finish()  # written before it is evaluated (eval.mode=slurm exports it)
            self.evaluate(model, step, logger, checkpointer.folder / f"step-{step}")

    # what --------------------------------------------------------------------------------------------

    def validate(self, model, step: int, tokens: int, logger) -> None:
        """Token-weighted validation loss over the same first ``eval.val_batches`` batches of each rank's part
        of the validation split of ``data.validation_source`` (default: of ``data.source``); every rank runs
        the same number of forwards (FSDP needs that). Chat data: the mean over the scored (assistant) tokens
        of all ranks; a rank whose batches hold none adds nothing."""
        from ..data import build_dataloader
        from ..evaluation import scored_loss_sum

        self._validated_step = step
        if self.tokenizer is None:
            return
        cfg = self.cfg
        loader = build_dataloader(
            cfg.data,
            tokenizer=self.tokenizer,
            batch_size=self.micro_batch,
            dp_rank=self.env.rank,
            dp_world_size=self.env.world_size,
            seed=cfg.run.seed,
            source=cfg.data.validation_source or cfg.data.source,
            split="validation",
            num_workers=0,
            cycle=True,
        )
        batches = (batch for _, batch in zip(range(cfg.eval.val_batches), loader, strict=False))
        loss_sum, count = scored_loss_sum(model, batches)
        totals = torch.tensor([loss_sum, float(count)], dtype=torch.float64, device=self.env.device)
        dist.all_reduce(totals)
        if totals[1].item() == 0:  # every rank sees the same totals: all skip together
            if self.env.is_main:
                print(
                    f"step {step:>6} | val loss skipped: no scored token in {cfg.eval.val_batches} batches", flush=True
                )
            return
        mean = (totals[0] / totals[1]).item()
        logger.log({"step": step, "tokens": tokens, "val_loss": mean, "val_ppl": math.exp(mean)}, console=False)
        if self.env.is_main:
            print(f"step {step:>6} | val loss {mean:.4f} | val ppl {math.exp(mean):.2f}", flush=True)

    def evaluate(self, model, step: int, logger, checkpoint_dir: Path) -> dict | None:
        """Run the configured lm-eval tasks on the current weights: in this job (rank 0, the others wait on a
        gloo group with a long timeout), or as a separate Slurm job on an export of the checkpoint
        (``eval.mode=slurm``; the others wait for the export)."""
        if self.tokenizer is None:
            if self.env.is_main:
                print("note: eval skipped: the trainer was given its batches, so it has no tokenizer", flush=True)
            return None
        out_path = self.run_dir / RESULTS / f"step-{step}.json"
        wait_group = self._eval_wait_group()
        if self.cfg.eval.mode == "slurm":

            def submit() -> None:
                if self.env.is_main:
                    self._submit_eval_job(checkpoint_dir, step, out_path)

            together(submit, wait_group)  # the others wait; a failure on rank 0 ends every rank with its line
            return None
        full = self._gather_full_model(model)
        results = None
        if self.env.is_main:
            from ..evaluation import evaluate, wandb_summary

            make_folder(out_path.parent)  # never through a link planted there

            eval_cfg = self.cfg.eval
            results = evaluate(
                full,
                self.tokenizer,
                list(eval_cfg.tasks),
                include_path=eval_cfg.include_path,
                limit=eval_cfg.limit,
                batch_size=eval_cfg.batch_size,
                out_path=out_path,
                local_data=eval_cfg.local_data,
                device=self.env.device,
            )
            summary = wandb_summary(results)
            logger.log({"step": step, **summary}, console=False)
            logger.summary(summary)
            print(f"eval results: {out_path}", flush=True)
        dist.barrier(group=wait_group)
        return results

    # how ---------------------------------------------------------------------------------------------

    def _gather_full_model(self, model) -> Transformer | None:
        """The unsharded model on rank 0 (None elsewhere): a collective, every rank calls it."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(model, options=options)
        if not self.env.is_main:
            return None
        return model_from_state(self.model_args, state, self.env.device).eval()

    def _eval_wait_group(self):
        """A gloo group over all ranks with a long timeout, created once (a collective: every rank calls it).
        Waiting on it keeps the default group's timeout (``parallel.timeout_s``) short."""
        if self._wait_group is None:
            self._wait_group = dist.new_group(backend="gloo", timeout=EVAL_WAIT)
        return self._wait_group

    def _submit_eval_job(self, checkpoint_dir: Path, step: int, out_path: Path) -> None:
        from ..export import export_checkpoint

        export_dir = make_folder(make_folder(self.run_dir / EXPORTS) / f"step-{step}")  # neither through a link
        export_checkpoint(checkpoint_dir, export_dir)
        if shutil.which("sbatch") is None:
            print(
                f"warning: eval.mode=slurm but sbatch is not on PATH; evaluate later with: sbatch slurm/eval.sh {export_dir}",
                file=sys.stderr,
            )
            return
        eval_cfg = self.cfg.eval
        cmd = ["sbatch", "slurm/eval.sh", str(export_dir), "--tasks", ",".join(eval_cfg.tasks), "--out", str(out_path)]
        for flag, value in (("--include-path", eval_cfg.include_path), ("--local-data", eval_cfg.local_data)):
            if value:
                cmd += [flag, value]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip(), flush=True)
