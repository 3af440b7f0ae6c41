"""Training metrics: one readable console line, RUN_DIR/metrics.jsonl, wandb and TensorBoard on rank 0."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from ..config import Config, to_dict
from ..gpu_cards import peak_flops_for


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
        with self.path.open("a") as f:
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
