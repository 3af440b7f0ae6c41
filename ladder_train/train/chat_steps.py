"""Chat data (``data.format: chat``) scores only the labels that are not -100, so a step's divisor is the number of
scored labels in the whole global batch, and a global batch may hold none: such a batch teaches nothing, and an
update would only decay the weights."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..data.packing import IGNORE_INDEX
from ..data.protocol import Batch
from ..errors import InputError


class NothingToLearn(InputError):
    """Chat data whose first global batch scores no token: training on it would only decay the weights."""

    def __init__(self, message: str, quiet: bool = False):
        super().__init__(message)
        self.quiet = quiet


def scored_micro_batches(
    next_micro_batch: Callable[[], Batch], accumulation: int, device: torch.device, world_size: int
) -> tuple[list[Batch], float, int]:
    """This rank's micro-batches of the step, the divisor of their summed losses (the number of scored labels, not
    -100, in the whole global batch / the world size) and that number (one small all-reduce)."""
    batches = [next_micro_batch() for _ in range(accumulation)]
    scored = sum(int((labels != IGNORE_INDEX).sum()) for _, labels in batches)
    total = torch.tensor(scored, dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return batches, max(total.item(), 1) / world_size, int(total.item())


@dataclass
class EmptyBatches:
    """The global batches with no scored token: the first one of a run stops it (the data or the chat template gives
    nothing to learn), later ones are skipped and counted (``empty_skips`` in the trainer entry)."""

    source: str | None  # data.source, named by the refusal
    is_main: bool
    skips: int = 0

    def skip(self, step: int, tokens_seen: int) -> None:
        """Step ``step`` trains on nothing; raises NothingToLearn when no step trained before it."""
        if tokens_seen == 0:
            raise NothingToLearn(
                f"data.source={self.source}: the first global batch holds no token to learn from (no assistant turn "
                f"in its conversations, or a data.chat_template that renders none)",
                quiet=not self.is_main,
            )
        self.skips += 1
        if self.is_main:
            print(
                f"warning: step {step}: no scored token in the global batch; update skipped ({self.skips} so far)",
                flush=True,
            )

    def state_dict(self) -> dict:
        return {"empty_skips": self.skips}

    def load_state_dict(self, state: dict) -> None:
        self.skips = state.get("empty_skips", 0)  # an entry without it counted none
