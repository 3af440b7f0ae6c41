"""What a run records for looking at it, into the run folder.

Every step's figures (``MetricLogger``, rank 0): one readable console line, RUN_DIR/metrics.jsonl, wandb and
TensorBoard, with tokens/s, the share of time spent waiting for data, MFU and memory (``ThroughputMeter``).

On request (the ``profile.*`` keys), a rank's look inside its steps, into RUN_DIR/profile/ (``StepProfiler``):

- ``profile.enabled``: torch.profiler chrome traces of a few optimizer steps on the wait / warmup / active
  schedule, ``rank{r}_steps{a}-{b}.pt.trace.json`` (open in https://ui.perfetto.dev or chrome://tracing);
- ``profile.memory_snapshot_step`` (CUDA): the caching allocator's history, recorded from the start and dumped
  as ``rank{r}_memory_step{N}.pickle`` after step N and as ``rank{r}_memory_oom_after_step{N}.pickle`` when an
  OutOfMemoryError stops the run (open in https://pytorch.org/memory_viz).

The trainer creates a :class:`StepProfiler` as its loop starts, calls ``step`` after every optimizer step and
``close`` when the loop ends; with nothing enabled each call does nothing. ``trace_summary.py`` reads a trace back
(the GPU's busy share, kernels and runtime calls per step).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from ..config import Config, ProfileConfig, to_dict
from ..files import make_folder, open_to_write, refuse_link
from ..gpu_cards import peak_flops_for

# -- every step's figures ----------------------------------------------------------------------------------------------


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak for MFU, or None (CPU, or a GPU card the table does not know: MFU is then
    reported as null, with a one-time note). The peaks are ``gpu_cards.py``'s table (each figure with its
    datasheet), matched on the exact card ``torch.cuda.get_device_name`` reports: an "NVIDIA H100 PCIe" is 756
    TFLOPS, not the SXM card's 989.4."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_flops_for(name)
    if peak is None and name not in _UNKNOWN_CARDS:
        _UNKNOWN_CARDS.add(name)
        print(f"note: no bf16 peak known for {name!r} (ladder_train/gpu_cards.py): MFU is null", file=sys.stderr)
    return peak


_UNKNOWN_CARDS: set[str] = set()


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory, or the process's peak resident memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def format_line(m: dict) -> str:
    parts = [f"step {m['step']:>6}", f"loss {m['loss']:.4f}", f"lr {m['lr']:.2e}", f"gnorm {m['grad_norm']:.3f}"]
    parts.append(f"tok {m['tokens']:,}")
    parts.append(f"{m['tokens_per_s']:,.0f} tok/s ({m['tokens_per_s_per_device']:,.0f}/dev)")
    parts.append(f"step {m['step_time_s'] * 1000:.0f} ms")
    parts.append(f"data {m['data_wait_frac'] * 100:.1f}%")
    if m.get("mfu") is not None:
        parts.append(f"mfu {m['mfu'] * 100:.1f}%")
    parts.append(f"mem {m['peak_mem_gib']:.2f} GiB")
    return " | ".join(parts)


class ThroughputMeter:
    """Tokens/s, the share of time spent waiting for data, MFU and memory over the steps since the last read."""

    def __init__(self, world_size: int, flops_per_token: float, peak_flops: float | None, device: torch.device):
        self.world_size, self.flops_per_token, self.peak_flops, self.device = (
            world_size,
            flops_per_token,
            peak_flops,
            device,
        )
        self._start, self._tokens, self._data_wait = time.perf_counter(), 0, 0.0

    def add(self, tokens: int, data_wait_s: float) -> None:
        self._tokens += tokens
        self._data_wait += data_wait_s

    def read(self, step_time_s: float) -> dict:
        """The interval's figures; the next interval starts now."""
        elapsed = time.perf_counter() - self._start
        tokens_per_s = self._tokens / elapsed
        per_device = tokens_per_s / self.world_size
        figures = {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": per_device,
            "step_time_s": step_time_s,
            "data_wait_frac": self._data_wait / elapsed,
            "mfu": per_device * self.flops_per_token / self.peak_flops if self.peak_flops else None,
            "peak_mem_gib": peak_memory_gib(self.device),
        }
        self._start, self._tokens, self._data_wait = time.perf_counter(), 0, 0.0
        return figures


class MetricLogger:
    """Writes metrics on rank 0 only; other ranks get a logger that does nothing. A training step is logged
    every ``train.log_every`` steps and at the last one. ``resumed_step``: the step a resumed run starts after
    (TensorBoard hides what an earlier attempt logged past it)."""

    def __init__(self, cfg: Config, run_dir: Path, is_main: bool, wandb_id: str | None = None, resumed_step: int = 0):
        self.log_every = cfg.train.log_every
        self.is_main = is_main
        self.path = run_dir / "metrics.jsonl"
        self.wandb_run = None
        self.tensorboard = None
        if is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            self.wandb_run = _start_wandb(cfg, run_dir, wandb_id)
            if cfg.tensorboard.enabled:
                self.tensorboard = _start_tensorboard(run_dir, resumed_step)

    def should_log(self, step: int, last: bool) -> bool:
        return step % self.log_every == 0 or last

    def log(self, metrics: dict, console: bool = True) -> None:
        if not self.is_main:
            return
        # the wall-clock time is in the file only, so the order of runs and their duration are in the data
        row = {**metrics, "time": datetime.now(UTC).isoformat(timespec="seconds")}
        with open_to_write(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if console and "loss" in metrics:
            print(format_line(metrics), flush=True)
        scalars = {k: v for k, v in metrics.items() if k != "step" and v is not None}
        if self.wandb_run is not None:
            self.wandb_run.log(scalars, step=metrics["step"])
        if self.tensorboard is not None:
            for tag, value in scalars.items():
                if isinstance(value, (int, float)):  # TensorBoard scalars are numbers
                    self.tensorboard.add_scalar(tag, value, global_step=metrics["step"])

    def summary(self, values: dict) -> None:
        if self.wandb_run is not None:
            self.wandb_run.summary.update(values)

    @property
    def wandb_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run is not None else None

    def close(self) -> None:
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def _start_tensorboard(run_dir: Path, resumed_step: int):
    """A SummaryWriter on RUN_DIR/tensorboard/ (``tensorboard --logdir RUN_DIR/tensorboard``). A resumed run
    retrains the steps after its checkpoint: purging from the first of them keeps one point per step."""
    from torch.utils.tensorboard import SummaryWriter

    purge = resumed_step + 1 if resumed_step else None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge, flush_secs=30)


def _start_wandb(cfg: Config, run_dir: Path, wandb_id: str | None):
    """wandb.init with the resolved config; WANDB_MODE beats the recipe. Online without credentials (or
    without network) falls back to offline with a one-line note instead of stopping the run."""
    mode = os.environ.get("WANDB_MODE", cfg.wandb.mode)
    if mode == "disabled":
        return None
    import wandb

    settings = dict(
        project=cfg.wandb.project or os.environ.get("WANDB_PROJECT", "ladder-train"),
        entity=cfg.wandb.entity or os.environ.get("WANDB_ENTITY"),
        name=cfg.wandb.name or cfg.run.name,
        config=to_dict(cfg),
        dir=str(run_dir),
        id=wandb_id,
        resume="allow",
    )
    if mode == "online":
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=60), **settings)
        except Exception as err:  # no API key, no network: keep training, sync later with `wandb sync`
            print(
                f"wandb: online init failed ({str(err).splitlines()[0]}); logging offline to {run_dir}/wandb",
                file=sys.stderr,
            )
    return wandb.init(mode="offline", **settings)


# -- the profiler and the memory history -------------------------------------------------------------------------------

# allocation events the memory history keeps (a ring buffer): enough for several steps of a large model, a few
# hundred MB of snapshot at most
MEMORY_HISTORY_ENTRIES = 100_000
RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


def trace_activities(device: torch.device) -> list[ProfilerActivity]:
    """Host ops always; the device's kernels when they run on a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])


class StepProfiler:
    """The profiler and the memory history of one rank, started on construction."""

    def __init__(self, cfg: ProfileConfig, run_dir: Path, rank: int, device: torch.device):
        self.cfg, self.rank = cfg, rank
        self.folder = Path(run_dir) / "profile"
        self.traces: list[Path] = []
        self._last_step: int | None = None
        self._recorded: list[int] = []  # the trainer steps of the trace being recorded
        self._schedule = schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat)
        self._profiler = None
        # memory snapshots need the CUDA caching allocator; on the CPU profile.profile_memory is the memory view
        self._memory = cfg.memory_snapshot_step is not None and device.type == "cuda"
        if cfg.enabled or self._memory:
            make_folder(self.folder)
        if self._memory:
            torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
        if cfg.enabled:
            self._profiler = profile(
                activities=trace_activities(device),
                schedule=self._schedule,
                on_trace_ready=self._export,
                record_shapes=cfg.record_shapes,
                profile_memory=cfg.profile_memory,
                with_stack=cfg.with_stack,
            )
            self._profiler.start()

    def step(self, step: int) -> None:
        """Optimizer step ``step`` (the trainer's count) and what came with it are done."""
        self._last_step = step
        if self._profiler is not None:
            if self._schedule(self._profiler.step_num) in RECORDING:
                self._recorded.append(step)
            self._profiler.step()
        if self._memory and step == self.cfg.memory_snapshot_step:
            self._dump_memory(f"rank{self.rank}_memory_step{step}.pickle")

    def out_of_memory(self, step: int) -> None:
        """An OutOfMemoryError after optimizer step ``step``: dump the history that led to it (the caller
        re-raises)."""
        if self._memory:
            path = self._dump_memory(f"rank{self.rank}_memory_oom_after_step{step}.pickle")
            print(f"rank {self.rank}: out of memory; allocator history in {path}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stops recording; a trace whose active steps the run cut short is written with the steps it has."""
        if self._profiler is not None:
            steps_run = self._profiler.step_num
            self._profiler.stop()
            self._profiler = None
            if not self.traces and self.rank == 0:
                first = self.cfg.wait + self.cfg.warmup + 1
                print(
                    f"note: profile: no trace written: the run ended after {steps_run} steps of this process, "
                    f"before the traced ones (from its step {first})",
                    flush=True,
                )
        if self._memory:
            torch.cuda.memory._record_memory_history(enabled=None)
            self._memory = False

    def _export(self, prof) -> None:
        steps = self._recorded or [(self._last_step or 0) + 1]  # stopped in the first traced step: that one
        path = self.folder / f"rank{self.rank}_steps{steps[0]}-{steps[-1]}.pt.trace.json"
        prof.export_chrome_trace(str(refuse_link(path)))
        self.traces.append(path)
        self._recorded = []

    def _dump_memory(self, name: str) -> Path:
        path = self.folder / name
        torch.cuda.memory._dump_snapshot(str(refuse_link(path)))
        return path
