"""The pretraining loop: hold the run folder (one trainer per run.dir: ``RUN_DIR/run.lock``), build the mesh and the
sharded model, then step through the data (each step's parts: step.py). The checkpointer, the metric logger, the
stability guard and the evaluator each decide which steps are theirs.

Launch (``ladder_train.cli``): ``ladder-train --config recipes/X.yaml [key=value ...]`` alone, or
``torchrun --nproc-per-node N -m ladder_train.train --config ...`` for several processes.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint import Checkpointer
from ..config import Config, model_args, save_config, to_yaml
from ..data import MicroBatchLoader, as_loader
from ..data.protocol import Batch
from ..errors import EXIT_REQUEUE, InputError, Preempted
from ..lifetime import PREEMPTION_SIGNALS
from ..loading import check_init_source, load_initial_weights
from ..model import build_on_meta, flops_per_token
from ..parallel import (
    BatchSplit,
    RankEnv,
    build_mesh,
    init_sharded_weights,
    parallelize,
    resolve_degrees,
    resolve_dtype,
)
from .chat_steps import EmptyBatches, scored_micro_batches
from .evaluator import Evaluator
from .memory_plan import unsharded_fits
from .observability import MetricLogger, StepProfiler, ThroughputMeter, device_peak_flops
from .optim import build_optimizer, build_scheduler, freeze_lower_layers, resolve_schedule_steps
from .run_dir import RunSummary, lock_run_dir_on_rank0
from .run_state import RunState
from .stability import StabilityGuard
from .step import StepOutcome, accumulate_gradients, clip_and_reduce


class Trainer:
    """Owns the model, optimizer, schedule and data for one run on this process.

    ``batches`` replaces the configured data loader (tests feed fixed batches): a :class:`MicroBatchLoader`, or
    any iterable of this rank's micro-batches ``(inputs, labels)`` (no data position is then saved).
    """

    def __init__(self, cfg: Config, env: RankEnv, batches: MicroBatchLoader | Iterable[Batch] | None = None):
        self.cfg, self.env = cfg, env
        self.run_dir = Path(cfg.run.dir)
        fresh = not self.run_dir.exists()
        self._lock = lock_run_dir_on_rank0(self.run_dir, env.is_main)  # before anything is read or written
        try:
            self._build(batches)
        except InputError:  # refused before any work: a run folder made for it goes again
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            if fresh and env.is_main:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def _build(self, batches: MicroBatchLoader | Iterable[Batch] | None) -> None:
        """Everything a run needs, each input checked before the model is built."""
        cfg, env = self.cfg, self.env
        replicate, shard = resolve_degrees(cfg.parallel, env.world_size, env.local_world_size)
        self.batch = BatchSplit(
            cfg.train.global_batch_size, cfg.train.micro_batch_size, env.world_size, cfg.data.seq_len
        )
        self.batch.check()
        self.guard = StabilityGuard(cfg.train, self.run_dir, env.is_main)  # reads the hand-editable skip file
        self.model_args = model_args(cfg.model)
        # the weights a new run starts from are checked against the recipe before any data or model is built
        init_from = cfg.checkpoint.init_from
        self.init_source = check_init_source(init_from, self.model_args) if init_from else None
        self.tokenizer = None
        # tokenizer and sources are checked before the model is built
        self.loader = self._build_data() if batches is None else as_loader(batches)
        self._batches: Iterator[Batch] | None = None

        self.mesh = build_mesh(env.device.type, replicate, shard)
        self.compute_dtype = resolve_dtype(cfg.train.dtype, env.device)
        model = build_on_meta(self.model_args)
        freeze_lower_layers(model, cfg.train.freeze_layers)
        fits = functools.partial(unsharded_fits, cfg, self.model_args, self.batch, env.device)  # asked under FSDP
        self.model, self.micro_batch_plan = parallelize(model, cfg.parallel, self.mesh, self.compute_dtype, fits)
        self.summary = RunSummary(self.run_dir, self.micro_batch_plan.accumulate, env.is_main)
        self.model.to_empty(device=env.device)
        init_sharded_weights(self.model, cfg.run.seed)

        self.warmup, self.total_steps = resolve_schedule_steps(cfg.train.schedule, self.batch.tokens_per_step)
        self.max_steps = cfg.train.max_steps or self.total_steps
        self.optimizer = build_optimizer(self.model, cfg.train.optimizer)
        self.scheduler = build_scheduler(self.optimizer, cfg.train.schedule, self.batch.tokens_per_step)
        self.step = 0
        self.tokens_seen = 0
        self.wandb_id: str | None = None
        self.empty_batches = EmptyBatches(cfg.data.source, env.is_main)  # chat data: no scored token
        flops = flops_per_token(self.model_args, cfg.data.seq_len, frozen_layers=cfg.train.freeze_layers)
        self.meter = ThroughputMeter(env.world_size, flops, device_peak_flops(env.device), env.device)
        self.checkpointer = Checkpointer(cfg.checkpoint, self.run_dir, env.rank, env.world_size)
        self.evaluator = Evaluator(cfg, env, self.run_dir, self.model_args, self.batch.micro_batch, self.tokenizer)
        self.run_state = RunState(
            self, self.guard, self.empty_batches, self.scheduler, self.loader, self.model_args, env, self.total_steps
        )
        self._preempt_signal: int | None = None
        self._preempt_all = False
        self._resume()

    def _build_data(self) -> MicroBatchLoader:
        from ..data import build_dataloader, check_vocab, load_tokenizer

        self.tokenizer = load_tokenizer(self.cfg.data.tokenizer)
        check_vocab(self.tokenizer, self.cfg.model.vocab_size, "model.vocab_size")
        return build_dataloader(
            self.cfg.data,
            tokenizer=self.tokenizer,
            batch_size=self.batch.micro_batch,
            dp_rank=self.env.rank,
            dp_world_size=self.env.world_size,
            seed=self.cfg.run.seed,
            global_batch_size=self.batch.global_batch,  # token folders: the global order's batch
        )

    @property
    def empty_skips(self) -> int:
        """Chat data: global batches with no scored token, skipped."""
        return self.empty_batches.skips

    # checkpoints ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The loop's own counters, in the trainer entry of a checkpoint."""
        return {"step": self.step, "tokens_seen": self.tokens_seen, "wandb_id": self.wandb_id}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen, self.wandb_id = state["step"], state["tokens_seen"], state["wandb_id"]

    def save_checkpoint(self) -> None:
        state = self.run_state
        self.checkpointer.save(self.step, self.model, self.optimizer, state.trainer_entry(), state.rank_entry())

    def _resume(self) -> None:
        """Continue the newest checkpoint of run.dir (or checkpoint.load), else start from checkpoint.init_from."""
        path = self.checkpointer.resume_path()
        if path is None:
            if self.init_source is not None:
                load_initial_weights(self.model, self.init_source)
                if self.env.is_main:
                    print(f"starting from the weights of {self.init_source.path} ({self._layout_note()})", flush=True)
            return
        if self.init_source is not None and self.env.is_main:
            print(f"note: run.dir holds {path}: resuming it; checkpoint.init_from is not read again", flush=True)
        model_only = self.cfg.checkpoint.load_model_only
        expected = {k: v for k, v in dataclasses.asdict(self.model_args).items() if k not in ("init_std",)}
        state, rank_state = self.checkpointer.load(path, self.model, self.optimizer, expected, model_only)
        if model_only:
            if self.env.is_main:
                print(f"loaded weights from {path} (step {state['step']}); optimizer, schedule and data start fresh")
            return
        note = self.run_state.restore(state, rank_state)
        # a checkpoint of another run folder (a branch, e.g. a cool-down) starts its own wandb run
        if not path.resolve().is_relative_to(self.run_dir.resolve()):
            self.wandb_id = None
        if self.env.is_main:
            print(f"resuming from {path} at step {self.step} ({self.tokens_seen:,} tokens){note}", flush=True)

    def _layout_note(self) -> str:
        layouts = self.model_args.layer_layouts()
        source = self.init_source.args.layer_layouts()
        changed = sum(a != b for a, b in zip(layouts, source, strict=True))
        frozen = self.cfg.train.freeze_layers
        return f"{changed} of {len(layouts)} layers change layout" + (f", the first {frozen} frozen" if frozen else "")

    def _request_preemption(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._preempt_signal is not None:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the checkpoint
        self._preempt_signal = signum

    # one optimizer step ------------------------------------------------------------------------------

    def train_step(self) -> StepOutcome:
        """Forward/backward over this rank's micro-batches, clip, verdict, step (the parts: step.py). The loss of each
        micro-batch is its summed token loss over this rank's tokens per step, and FSDP averages over ranks: the step
        minimises the mean over the global batch's tokens, however it is split. Chat data (``data.format: chat``)
        scores only the labels that are not -100: the step's micro-batches are fetched first and the divisor is
        their number over the global batch (one small all-reduce) / the world size, so the step minimises the
        mean over the global batch's scored tokens."""
        split = self.batch
        tokens_per_rank = split.per_rank * split.seq_len
        data_wait = 0.0
        step_batches = None
        if self.cfg.data.format == "chat":
            waited = time.perf_counter()
            step_batches, tokens_per_rank, scored = scored_micro_batches(
                self._next_micro_batch, split.accumulation, self.env.device, self.env.world_size
            )
            data_wait += time.perf_counter() - waited
            if scored == 0:
                self.empty_batches.skip(self.step + 1, self.tokens_seen)
                return StepOutcome(0.0, 0.0, data_wait, self.guard.empty_step())
        fetch = self._next_micro_batch if step_batches is None else iter(step_batches).__next__
        loss_sum, fetch_wait = accumulate_gradients(
            self.model, fetch, split.accumulation, tokens_per_rank, self.env.device, self.micro_batch_plan
        )
        stop_asked = self._preempt_signal is not None
        loss_value, norm_value, self._preempt_all = clip_and_reduce(
            self.model, self.cfg.train.optimizer.grad_clip, loss_sum, stop_asked, self.env.world_size
        )
        verdict = self.guard.judge(self.step + 1, loss_value, norm_value)  # the same on every rank
        if verdict.update:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss_value, norm_value, data_wait + fetch_wait, verdict)

    def _next_micro_batch(self) -> Batch:
        if self._batches is None:  # created after a resume restored the loader's position
            self._batches = iter(self.loader)
        return next(self._batches)

    def _draw_global_batch(self) -> list[Batch]:
        return [self._next_micro_batch() for _ in range(self.batch.accumulation)]

    # the loop ----------------------------------------------------------------------------------------

    def train(self) -> list[dict]:
        logger = self._start_logging()
        profiler = StepProfiler(self.cfg.profile, self.run_dir, self.env.rank, self.env.device)
        handlers = {sig: signal.signal(sig, self._request_preemption) for sig in PREEMPTION_SIGNALS}
        history: list[dict] = []
        self.model.train()
        try:
            while self.step < self.max_steps:
                history.append(self._step(logger))
                self.evaluator.maybe_validate(self.model, self.step, self.tokens_seen, logger)
                if self._preempt_all:
                    self._stop_for_preemption()
                if self.checkpointer.maybe_save(self.step, self.max_steps, self.model, self.optimizer, self.run_state):
                    self.evaluator.maybe_evaluate(self.model, self.step, logger, self.checkpointer)
                profiler.step(self.step)
            if history:
                self.evaluator.maybe_validate(self.model, self.step, self.tokens_seen, logger, last=True)
                self.save_checkpoint()  # the final checkpoint
                self.evaluator.maybe_evaluate(self.model, self.step, logger, self.checkpointer, last=True)
            self.checkpointer.finish()
            self._mark_finished(history)
            logger.summary({"final_loss": history[-1]["loss"] if history else None, "tokens": self.tokens_seen})
        except torch.OutOfMemoryError:
            profiler.out_of_memory(self.step)  # the allocator's history, when profile.memory_snapshot_step records it
            raise
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            try:
                profiler.close()  # writes a cut-short trace: a failure there must not keep run.dir locked
            finally:
                self._close(logger)
        return history

    def _step(self, logger) -> dict:
        """One optimizer step and its bookkeeping; the record is logged when the logger says so."""
        step_start = time.perf_counter()
        lr = self.scheduler.get_last_lr()[0]
        # global batches recorded by a spike under train.spike.action=stop are read and dropped, never trained on
        self.guard.next_global_batch(self._draw_global_batch)
        outcome = self.train_step()
        self.step += 1
        self.tokens_seen += self.batch.tokens_per_step
        verdict = outcome.verdict
        if verdict.fail is not None:
            raise verdict.fail
        self.meter.add(self.batch.tokens_per_step, outcome.data_wait_s)
        record = {"step": self.step, "loss": outcome.loss, "lr": lr, "grad_norm": outcome.grad_norm}
        record.update(verdict.record())
        spike = verdict.spike_z is not None
        if logger.should_log(self.step, last=self.step == self.max_steps) or spike:  # a spike is always logged
            record.update(tokens=self.tokens_seen, **verdict.counts())
            record.update(self.meter.read(time.perf_counter() - step_start))
            logger.log(record)
        if verdict.stop is not None:
            self.checkpointer.finish()  # a background save completes: it is where the restart starts
            raise verdict.stop
        return record

    def _start_logging(self) -> MetricLogger:
        cfg, env = self.cfg, self.env
        if env.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
            print(to_yaml(cfg), end="")
            print(
                f"mesh {tuple(self.mesh.shape)} (dp_replicate, dp_shard) | {env.world_size} processes on {env.device.type}"
                f" | {self.compute_dtype} | global batch {self.batch.global_batch} = {self.batch.dp_world} ranks x "
                f"{self.batch.accumulation} micro-batches x {self.batch.micro_batch} | warmup {self.warmup}, "
                f"total {self.total_steps}, running {self.max_steps} steps",
                flush=True,
            )
            gradients = self.micro_batch_plan.describe()
            if gradients is not None:
                print(gradients, flush=True)
            self.summary.write(self.step, self.tokens_seen)  # what the run chose, readable while it runs
        logger = MetricLogger(cfg, self.run_dir, env.is_main, wandb_id=self.wandb_id, resumed_step=self.step)
        # every rank saves the trainer entry and DCP keeps one rank's copy: all must carry rank 0's id
        box = [logger.wandb_id]
        dist.broadcast_object_list(box, src=0)
        self.wandb_id = box[0]
        return logger

    def _mark_finished(self, history: list[dict]) -> None:
        """The run reached its last step (a study skips it): summary.json says so, written last, by rank 0."""
        if self.step >= self.max_steps:
            final = {"final_loss": history[-1]["loss"]} if history else {}
            self.summary.write(self.step, self.tokens_seen, finished=True, **final)

    def _stop_for_preemption(self):
        self.save_checkpoint()
        self.checkpointer.finish()
        raise Preempted(f"stopped by a signal after step {self.step}; checkpoint saved, exit {EXIT_REQUEUE} to requeue")

    def _close(self, logger) -> None:
        self.summary.stopped(self.step, self.tokens_seen)  # stopped before its last step: the step it reached
        self.loader.close()  # workers stop now, also after an exception (train() runs once)
        self._batches = None
        logger.close()
        if self._lock is not None:
            self._lock.close()  # releases run.dir
            self._lock = None
