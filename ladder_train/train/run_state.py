"""What a checkpoint carries beside the weights and the optimizer: the trainer entry, saved once and restored at any
world size, and one entry per rank, restored on the same world size only. Each part keeps and restores its own
state (``state_dict`` / ``load_state_dict``); the entries keep the flat keys older checkpoints hold."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.optim.lr_scheduler import LRScheduler

from ..config import ConfigError
from ..data import MicroBatchLoader
from ..model import ModelArgs
from ..parallel import RankEnv
from .chat_steps import EmptyBatches
from .optim import apply_schedule
from .stability import StabilityGuard


@dataclass
class RunState:
    """The parts of a run a checkpoint restores, and the entries they are saved in."""

    counters: Stateful  # the trainer's step, tokens seen and wandb id
    guard: StabilityGuard
    empty_batches: EmptyBatches
    scheduler: LRScheduler
    loader: MicroBatchLoader
    model_args: ModelArgs
    env: RankEnv
    schedule_steps: int  # this run's schedule length (train.schedule.total_steps or total_tokens, in steps)

    def trainer_entry(self) -> dict:
        """Saved once: every part whose state is the same on every rank, and the model's shape."""
        return {
            **self.counters.state_dict(),
            **self.guard.state_dict(),
            **self.empty_batches.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "model_args": dataclasses.asdict(self.model_args),
            "data": self.loader.global_state(),  # token folders: the position every rank shares
        }

    def rank_entry(self) -> dict:
        """Saved per rank: the random state and this rank's data position."""
        state = {"rng_cpu": torch.get_rng_state()}
        if self.env.device.type == "cuda":
            state["rng_cuda"] = torch.cuda.get_rng_state(self.env.device)
        if (data := self.loader.state_dict()) is not None:
            state["data"] = data
        return state

    def restore(self, trainer_entry: dict, rank_entry: dict | None) -> str:
        """Each part from its entry; ``rank_entry`` is None when the checkpoint was saved on another world size.
        Returns what the resume line adds: empty, or on another world size where the data continues."""
        self.counters.load_state_dict(trainer_entry)
        self.guard.load_state_dict(trainer_entry)
        self.empty_batches.load_state_dict(trainer_entry)
        self.scheduler.load_state_dict(trainer_entry["scheduler"])
        saved_lr = self.scheduler.get_last_lr()[0]
        apply_schedule(self.scheduler)  # this run's schedule from the restored step on (a longer total_steps)
        schedule_note = self._check_schedule(trainer_entry["step"], saved_lr, self.scheduler.get_last_lr()[0])
        self.loader.load_global_state(trainer_entry.get("data"))
        if rank_entry is not None:
            torch.set_rng_state(rank_entry["rng_cpu"])
            if "rng_cuda" in rank_entry and self.env.device.type == "cuda":
                torch.cuda.set_rng_state(rank_entry["rng_cuda"], self.env.device)
            self.loader.load_state_dict(rank_entry.get("data"))
            return schedule_note
        self.loader.load_state_dict(None)
        # a position kept per rank starts again from the beginning, and the recorded batch numbers lose their batches
        restarted = self.guard.data_restarted() if self.loader.global_state() is None else ""
        return schedule_note + (
            f"; saved with {trainer_entry['world_size']} processes, now {self.env.world_size}: weights and optimizer "
            f"resharded, {self.loader.describe()}{restarted}"
        )

    def _check_schedule(self, step: int, saved_lr: float, lr: float) -> str:
        """A schedule changed on resume is said (a longer total_steps is the usual reason); one that ended before
        the restored step is refused: the rate would fall to its floor at once."""
        if math.isclose(lr, saved_lr, rel_tol=1e-6):
            return ""
        if step >= self.schedule_steps:
            raise ConfigError(
                f"key 'train.schedule.total_steps': this run's schedule ends at step {self.schedule_steps}, before the "
                f"checkpoint's step {step}, so the learning rate would drop from {saved_lr:.3g} to {lr:.3g} at once; "
                f"give a schedule longer than {step} steps"
            )
        return f"; learning rate {saved_lr:.3g} -> {lr:.3g} (this run's schedule at step {step})"
