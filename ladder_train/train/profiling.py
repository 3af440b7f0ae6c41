"""What a rank records for looking inside a run, into RUN_DIR/profile/ (the ``profile.*`` keys):

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

import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, schedule

from ..config import ProfileConfig

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
            self.folder.mkdir(parents=True, exist_ok=True)
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
        prof.export_chrome_trace(str(path))
        self.traces.append(path)
        self._recorded = []

    def _dump_memory(self, name: str) -> Path:
        path = self.folder / name
        torch.cuda.memory._dump_snapshot(str(path))
        return path
