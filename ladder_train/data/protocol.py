"""What the trainer asks of its data: :class:`MicroBatchLoader`, which every loader of ``build_dataloader``
implements (the on-the-fly ``PackedDataLoader``, the token-folder ``TokenFileLoader`` and ``TokenWindows``).

A loader keeps its position in one of two places. Per rank (``state_dict``): the on-the-fly stream, whose split
over the ranks depends on the world size. Global (``global_state``): the token-folder order, the same on every
rank, saved once and restored at any world size. Each loader refuses in one line (``DataError``) a restore it
cannot honour.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

import torch

from .token_loader import refuse_stream_resume

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, labels), LongTensor (micro-batch, seq_len) each


@runtime_checkable
class MicroBatchLoader(Protocol):
    """This rank's micro-batches, resumable from a checkpoint."""

    def __iter__(self) -> Iterator[Batch]:
        """The micro-batches from the current position on."""
        ...

    def state_dict(self) -> dict | None:
        """This rank's position, saved in this rank's entry; None when the loader keeps none per rank."""
        ...

    def load_state_dict(self, state: dict | None) -> None:
        """Continue at this rank's saved position; None: the checkpoint holds none for this rank (it was saved
        on another world size, or by a loader without one)."""
        ...

    def global_state(self) -> dict | None:
        """The position every rank shares, saved once in the trainer entry; None when the loader keeps none."""
        ...

    def load_global_state(self, state: dict | None) -> None:
        """Continue at the shared position of a checkpoint's trainer entry (None when it holds none)."""
        ...

    def describe(self) -> str:
        """One line for the log: where the data continues."""
        ...

    def close(self) -> None:
        """Stop any worker processes now."""
        ...


class GivenBatches:
    """Micro-batches handed to the trainer (tests, benchmarks) as a plain iterable: no position to save."""

    def __init__(self, batches: Iterable[Batch]):
        self.batches = batches

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: dict | None) -> None:
        """Nothing to restore: the iterable goes on where it stands."""

    def global_state(self) -> None:
        return None

    def load_global_state(self, state: dict | None) -> None:
        refuse_stream_resume(state)

    def describe(self) -> str:
        return "the data stream is re-split per rank and starts again from its beginning"

    def close(self) -> None:
        """Nothing to stop."""


def as_loader(batches: MicroBatchLoader | Iterable[Batch]) -> MicroBatchLoader:
    """``batches`` itself when it is a loader, else its micro-batches without a position."""
    return batches if isinstance(batches, MicroBatchLoader) else GivenBatches(batches)
