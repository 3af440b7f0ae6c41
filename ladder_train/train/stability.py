"""The verdict on one optimizer step before ``optimizer.step()`` (``StabilityGuard``), which also drops the global
batches a restart skips.

The verdict uses the step's all-reduced loss and global gradient norm, the same numbers on every rank, so every
rank takes the same decision without another collective.

- **Non-finite** (NaN/inf): the update is skipped, up to ``train.max_nonfinite_skips`` times, then the run stops.
- **Spike** (``train.spike``): a watched value more than ``threshold`` standard deviations above the mean of the
  previous ``window`` steps' finite values (a one-sided z-score, with the standard deviation floored at
  ``MIN_RELATIVE_STD`` of the mean so that a flat stretch does not make every wobble a spike). Every finite value
  joins the window, spikes included: a lasting change of level stops firing once the window has seen it.
  ``action`` decides: ``log``, ``skip`` the update, or ``stop`` with the batch recorded in
  ``RUN_DIR/skip_batches.json``; a restart resumes from the newest checkpoint and never trains on a recorded batch.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import InputError, RunFailed
from ..files import replace_written, write_text

SKIP_FILE = "skip_batches.json"  # in RUN_DIR: {"batches": [global batch numbers, 1-based], "spikes": [...]}
MIN_RELATIVE_STD = 0.01  # the z-score's standard deviation is at least 1 % of the window's mean


class NonFiniteLossError(RunFailed):
    """The loss or gradient norm became NaN or inf more often than train.max_nonfinite_skips allows."""


class LossSpikeStop(RunFailed):
    """A loss spike under train.spike.action=stop: the batch is recorded for the restart to skip."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


class SpikeDetector:
    """One-sided rolling z-scores of the watched values over the last ``window`` finite steps."""

    def __init__(self, window: int, threshold: float, watch: list[str]):
        self.window, self.threshold = window, threshold
        self.history = {name: deque(maxlen=window) for name in watch}

    def z_scores(self, values: dict[str, float]) -> dict[str, float] | None:
        """Each watched value's z-score against the window; None until the window is full."""
        if any(len(seen) < self.window for seen in self.history.values()):
            return None
        scores = {}
        for name, seen in self.history.items():
            mean = sum(seen) / len(seen)
            std = math.sqrt(sum((x - mean) ** 2 for x in seen) / (len(seen) - 1))
            scores[name] = (values[name] - mean) / max(std, MIN_RELATIVE_STD * abs(mean), 1e-12)
        return scores

    def observe(self, values: dict[str, float]) -> dict[str, float] | None:
        """The z-scores if any exceeds the threshold (a spike), else None; the values then join the window."""
        scores = self.z_scores(values)
        for name, seen in self.history.items():
            seen.append(values[name])
        return scores if scores and max(scores.values()) > self.threshold else None

    def state_dict(self) -> dict:
        return {name: list(seen) for name, seen in self.history.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, seen in self.history.items():
            seen.clear()
            seen.extend(state.get(name, []))


@dataclass(frozen=True)
class Verdict:
    """The guard's decision on one step, the same on every rank."""

    update: bool  # the optimizer may step
    spike_z: dict[str, float] | None = None  # the watched values' z-scores, when the step is a spike
    spikes: int | None = None  # spikes so far, when the detector is on
    fail: NonFiniteLossError | None = None  # past the non-finite limit: the run ends before the step is logged
    stop: LossSpikeStop | None = None  # a spike under action=stop: the run ends once the step is logged

    def record(self) -> dict[str, float]:
        """The step's metrics fields: ``spike`` and ``spike_z_*`` at a spike."""
        if self.spike_z is None:
            return {}
        return {"spike": 1, **{f"spike_z_{name}": score for name, score in self.spike_z.items()}}

    def counts(self) -> dict[str, int]:
        """The running totals for every logged record: ``spikes`` when the detector is on."""
        return {} if self.spikes is None else {"spikes": self.spikes}


class StabilityGuard:
    """Before a step, drops the global batches a spike recorded (``next_global_batch``); after its backward, judges
    it (``judge``: one typed :class:`Verdict`, which decides the update, warns and counts)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, is_main: bool):
        self.max_nonfinite_skips = cfg.max_nonfinite_skips
        self.spike_cfg = cfg.spike
        self.detector = SpikeDetector(cfg.spike.window, cfg.spike.threshold, list(cfg.spike.watch))
        self.run_dir, self.is_main = run_dir, is_main
        self.nonfinite_skips = 0
        self.spikes = 0
        self.batches_drawn = 0  # global batches taken from the data stream: the steps plus the batches skipped
        self.skip_batches = set(read_skip_file(run_dir)["batches"])

    def next_global_batch(self, draw_global_batch: Callable[[], object]) -> int:
        """Before a step: draw and drop every recorded global batch next in the stream (the step counter stays).
        Returns the number of the global batch the step trains on."""
        while self.batches_drawn + 1 in self.skip_batches:
            self.batches_drawn += 1
            draw_global_batch()
            if self.is_main:
                print(f"global batch {self.batches_drawn} skipped: recorded in {self.run_dir / SKIP_FILE}", flush=True)
        self.batches_drawn += 1
        return self.batches_drawn

    def judge(self, step: int, loss: float, grad_norm: float) -> Verdict:
        """Step ``step``'s all-reduced loss and gradient norm: finite? a spike? Warns, counts, and records the batch
        of a spike under action=stop."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return Verdict(update=False, spikes=self._spikes_counted(), fail=self._nonfinite(step, loss, grad_norm))
        if not self.spike_cfg.enabled:
            return Verdict(update=True)
        z = self.detector.observe({"loss": loss, "grad_norm": grad_norm})
        if z is None:
            return Verdict(update=True, spikes=self.spikes)
        self.spikes += 1
        action = self.spike_cfg.action
        stop = self._spike(step, z, {"loss": loss, "grad_norm": grad_norm})
        return Verdict(update=action == "log", spike_z=z, spikes=self.spikes, stop=stop)

    def empty_step(self) -> Verdict:
        """The verdict of a step that trained on nothing (chat data without a scored token): no update."""
        return Verdict(update=False, spikes=self._spikes_counted())

    def data_restarted(self) -> str:
        """The data stream starts again (another world size): recorded batch numbers no longer name the same
        batches. Returns a note for the resume line."""
        note = f" ({SKIP_FILE} no longer applies)" if self.skip_batches else ""
        self.skip_batches.clear()
        self.batches_drawn = 0
        return note

    def _spikes_counted(self) -> int | None:
        return self.spikes if self.spike_cfg.enabled else None

    def _spike(self, step: int, z: dict[str, float], values: dict[str, float]) -> LossSpikeStop | None:
        """Report a spike; under action=stop, record its batch and return the error to stop the run with."""
        scores = ", ".join(f"{name} {values[name]:.4g} (z {score:.1f})" for name, score in z.items())
        what = f"step {step}: loss spike: {scores} over the last {self.detector.window} steps"
        action = self.spike_cfg.action
        if action == "stop":
            batch = self.batches_drawn
            record_skipped_batch(self.run_dir, batch, step, {**values, "spike": z}, self.is_main)
            message = (
                f"{what}; stopped (train.spike.action=stop): global batch {batch} is recorded in "
                f"{self.run_dir / SKIP_FILE}; rerun the command to resume from the newest checkpoint without it"
            )
            return LossSpikeStop(message, quiet=not self.is_main)
        if self.is_main:
            done = "update skipped" if action == "skip" else "training on"
            print(f"warning: {what}; {done} ({self.spikes} spikes so far)", flush=True)
        return None

    def _nonfinite(self, step: int, loss: float, grad_norm: float) -> NonFiniteLossError | None:
        """Count a non-finite step; past the limit, the error to stop the run with."""
        self.nonfinite_skips += 1
        what = f"step {step}: loss {loss} / grad norm {grad_norm} is not finite"
        if self.nonfinite_skips > self.max_nonfinite_skips:
            limit = f"train.max_nonfinite_skips={self.max_nonfinite_skips}"
            return NonFiniteLossError(f"{what}; stopping ({limit} skips allowed)")
        if self.is_main:
            print(f"warning: {what}; update skipped ({self.nonfinite_skips}/{self.max_nonfinite_skips})")
        return None

    def state_dict(self) -> dict:
        """For the trainer entry of a checkpoint: the counts, the data position in global batches and the detector's
        window (a resume judges alike)."""
        return {
            "nonfinite_skips": self.nonfinite_skips,
            "spikes": self.spikes,
            "batches_drawn": self.batches_drawn,
            "spike_window": self.detector.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """From the trainer entry (flat keys; where an entry has only ``nonfinite_skips``, the rest start at zero)."""
        self.nonfinite_skips = state["nonfinite_skips"]
        self.spikes = state.get("spikes", 0)
        # where absent, every step drew one global batch
        self.batches_drawn = state["batches_drawn"] if "batches_drawn" in state else state["step"]
        self.detector.load_state_dict(state.get("spike_window", {}))


def read_skip_file(run_dir: Path) -> dict:
    """RUN_DIR/skip_batches.json, checked: a user may edit it, and a batch number that is not one would be
    trained on without a word."""
    path = run_dir / SKIP_FILE
    if not path.is_file():
        return {"batches": [], "spikes": []}
    try:
        recorded = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err}); expected {SKIP_FILE_SHAPE}") from None
    if not isinstance(recorded, dict) or "batches" not in recorded:
        raise InputError(f"{path}: expected {SKIP_FILE_SHAPE}, got {_short(recorded)}")
    batches, spikes = recorded["batches"], recorded.setdefault("spikes", [])
    if not isinstance(batches, list) or not all(_is_batch_number(b) for b in batches):
        raise InputError(f"{path}: key 'batches' must be a list of global batch numbers >= 1, got {_short(batches)}")
    if not isinstance(spikes, list):
        raise InputError(f"{path}: key 'spikes' must be a list, got {_short(spikes)}")
    return recorded


SKIP_FILE_SHAPE = '{"batches": [global batch numbers >= 1], "spikes": [...]}'


def _is_batch_number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def record_skipped_batch(run_dir: Path, batch: int, step: int, result: dict, is_main: bool) -> None:
    """Add global batch ``batch`` to RUN_DIR/skip_batches.json (rank 0 writes; a user may add numbers by hand)."""
    if not is_main:
        return
    recorded = read_skip_file(run_dir)
    recorded["batches"] = sorted(set(recorded["batches"]) | {batch})
    spike = {"step": step, "batch": batch, "loss": result["loss"], "grad_norm": result["grad_norm"]}
    recorded["spikes"].append({**spike, "z": result["spike"]})
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / SKIP_FILE
    write_text(path.with_suffix(".tmp"), json.dumps(recorded, indent=1) + "\n")
    replace_written(path.with_suffix(".tmp"), path)  # a reader never sees half a file
