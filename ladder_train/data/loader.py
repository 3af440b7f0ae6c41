"""The per-rank data loader: a torchdata ``StatefulDataLoader`` over :class:`PackedWindows`.

Each data-parallel rank reads a disjoint part of the documents (``split_dataset_by_node``: whole shards when
the shard count divides by the world size, else every world_size-th document), and inside a rank each loader
worker reads its own shards (``datasets`` assigns them). Windows are packed per worker and batches come from
the workers in turn, so the order is deterministic (also with ``data.shuffle_buffer``, a seeded block shuffle
of each worker's documents) and ``state_dict()`` / ``load_state_dict()`` resume exactly.

``data.format: chat`` reads conversations instead of texts (conversations.py): the same sources, order, split,
workers and resume; the labels are -100 where a token is not scored.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from datasets.distributed import split_dataset_by_node
from tokenizers import Tokenizer
from torchdata.stateful_dataloader import StatefulDataLoader

from ..config import DataConfig
from ..errors import DataError
from ..folders import is_token_folder
from .conversations import CHAT_COLUMN, ConversationEncoder, load_template
from .packing import PackedWindows, collate_windows
from .protocol import MicroBatchLoader
from .sources import bad_row_message, open_source, read_error_message
from .token_loader import refuse_stream_resume, token_loader
from .tokenizer import eos_id
from .workers import init_worker, worker_context

log = logging.getLogger(__name__)

_FINGERPRINT = "ladder_data"  # state_dict key of what the state was saved for
FORMATS = ("text", "chat")  # data.format


class PackedDataLoader(StatefulDataLoader):
    """A StatefulDataLoader whose state also records what it was built for (source, split, seq_len, rank,
    world size, workers), so a resume with a different data setup stops with a clear message instead of
    silently reading other data. Its position is per rank (a :class:`MicroBatchLoader` without a global one)."""

    def __init__(self, *args, fingerprint: dict[str, Any], **kwargs):
        super().__init__(*args, **kwargs)
        self.fingerprint = fingerprint
        self._position = "the data stream starts at its beginning"

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), _FINGERPRINT: dict(self.fingerprint)}

    def load_state_dict(self, state_dict: dict[str, Any] | None) -> None:
        if state_dict is None:  # saved on another world size: this rank's part of the stream is another
            self._position = "the data stream is re-split per rank and starts again from its beginning"
            return
        state_dict = dict(state_dict)
        saved = state_dict.pop(_FINGERPRINT, None)
        if saved is not None:
            # states saved before shuffling (or chat data) existed were unshuffled text
            saved = {"shuffle_buffer": 0, "format": "text", **saved}
        if saved is not None and saved != self.fingerprint:
            diff = ", ".join(
                f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in self.fingerprint.items() if saved.get(k) != v
            )
            raise DataError(
                f"data loader state was saved for another data setup ({diff}); resume with the same data.* and ranks"
            )
        super().load_state_dict(state_dict)
        self._position = "the data stream continues at this rank's saved position"

    def global_state(self) -> None:
        return None

    def load_global_state(self, state: dict | None) -> None:
        refuse_stream_resume(state)

    def describe(self) -> str:
        return self._position

    def __iter__(self):
        return _one_line_errors(functools.partial(StatefulDataLoader.__iter__, self), self.timeout)

    def close(self) -> None:
        """Stop the worker processes now (not at garbage collection, which an exception can delay to exit)."""
        iterator = getattr(self, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self._iterator = None

    @property
    def epoch(self) -> int:
        """Passes over this rank's documents completed so far (the furthest worker's, from the last state)."""
        return max(_epochs(super().state_dict()), default=0)


def _one_line_errors(start: Callable[[], Iterator], timeout: float):
    """The batches of ``start()``; a DataError raised in a worker arrives wrapped in the worker's traceback (torch
    re-raises it with that text as the message): keep its own one line. A worker past data.worker_timeout_s is one
    line too, also where ``start()`` already waits for the workers (a resumed iterator replays to its position)."""
    batches = None
    while True:
        try:
            if batches is None:
                batches = start()
            batch = next(batches)
        except StopIteration:
            return
        except DataError as err:
            message = str(err)
            if "\n" not in message:
                raise
            last = [line for line in message.splitlines() if line.strip()][-1]
            raise DataError(last.split("DataError: ", 1)[-1]) from None
        except RuntimeError as err:
            if timeout and str(err).startswith("DataLoader timed out"):
                raise DataError(
                    f"data: a loader worker gave no batch in {timeout:g} s (data.worker_timeout_s): it is stuck, "
                    "so the run stops for a restart from its last checkpoint"
                ) from None
            raise
        yield batch


def _epochs(state: Any):
    """Every PackedWindows ``epoch`` inside a StatefulDataLoader state (one per worker)."""
    if isinstance(state, dict):
        if "epoch" in state and "buffer" in state:
            yield state["epoch"]
        for value in state.values():
            yield from _epochs(value)


def build_dataloader(
    data_cfg: DataConfig,
    tokenizer: Tokenizer,
    batch_size: int,
    dp_rank: int = 0,
    dp_world_size: int = 1,
    seed: int = 0,
    split: str | None = None,
    source: str | None = None,
    num_workers: int | None = None,
    cycle: bool | None = None,
    global_batch_size: int | None = None,
) -> MicroBatchLoader:
    """Batches of ``(inputs, labels)``, LongTensor ``(batch_size, data_cfg.seq_len)`` each, for one
    data-parallel rank.

    The training split (``data_cfg.split``, the default) reads ``data_cfg.source`` and cycles epochs (an
    endless stream); another split (``"validation"``) reads ``source``, else ``data_cfg.validation_source``,
    else that split of ``data_cfg.source``, in one pass. ``source`` / ``cycle`` override either.
    The order is deterministic: files in name order, documents in file order, or with ``data_cfg.shuffle_buffer``
    > 0 (training split only) permuted in blocks of that many, seeded by ``seed`` and the epoch. ``seed`` is
    recorded in the state so a resume under another seed is refused. Sources are validated here, before
    workers start.

    ``data_cfg.format == "chat"``: the documents are the ``messages`` of each row, rendered with the chat
    template of ``data_cfg.chat_template``, and the labels are -100 except on assistant tokens (conversations.py).

    Token folders (``ladder-data prepare``: ``data.sources``, or a token folder as the source) are read by memory
    map instead (token_loader.py), the training split in a global order of ``global_batch_size`` instances per
    step (default: ``batch_size`` x ranks) that does not depend on the world size.
    """
    _check_request(data_cfg, batch_size, dp_rank, dp_world_size)
    training = split is None or split == data_cfg.split
    split = data_cfg.split if split is None else split
    if source is None:
        source = data_cfg.source if training else (data_cfg.validation_source or data_cfg.source)
    cycle = training if cycle is None else cycle
    if (training and data_cfg.sources) or is_token_folder(source):
        return token_loader(
            data_cfg, tokenizer, source, training, batch_size, dp_rank, dp_world_size, seed, global_batch_size, cycle
        )
    num_workers = data_cfg.num_workers if num_workers is None else num_workers
    return _stream_loader(
        data_cfg, tokenizer, batch_size, dp_rank, dp_world_size, seed, split, str(source), num_workers, cycle, training
    )


def _stream_loader(
    data_cfg: DataConfig,
    tokenizer: Tokenizer,
    batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    split: str,
    source: str,
    num_workers: int,
    cycle: bool,
    training: bool,
) -> PackedDataLoader:
    """The on-the-fly path: documents streamed, tokenized and packed in the loader's workers."""
    chat = data_cfg.format == "chat"
    encoder, column = _conversation_encoder(data_cfg, tokenizer) if chat else (None, data_cfg.text_column)

    documents = open_source(str(source), split, column, data_cfg.hub_config, chat=encoder is not None)
    documents = split_dataset_by_node(documents, rank=dp_rank, world_size=dp_world_size)
    if documents.num_shards % dp_world_size:
        log.info(
            "data: %d shards do not divide over %d ranks: each rank keeps every %d-th document",
            documents.num_shards,
            dp_world_size,
            dp_world_size,
        )
    # only the training stream is shuffled: validation batches stay the same documents in the same order
    shuffle_buffer = data_cfg.shuffle_buffer if training else 0
    windows = PackedWindows(
        documents,
        tokenizer,
        data_cfg.seq_len,
        eos_id(tokenizer),
        column,
        cycle,
        str(source),
        shuffle_buffer=shuffle_buffer,
        seed=seed,
        describe_read_error=functools.partial(read_error_message, str(source), split, column),
        encoder=encoder,
        describe_bad_row=functools.partial(bad_row_message, str(source), split),
    )
    if num_workers > 0:  # set before the fork server starts: workers inherit it (init_worker sets it again)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fingerprint = {
        "source": str(source),
        "split": split,
        "seq_len": data_cfg.seq_len,
        "dp_rank": dp_rank,
        "dp_world_size": dp_world_size,
        "num_workers": num_workers,
        "seed": seed,
        "vocab_size": tokenizer.get_vocab_size(),
        "shuffle_buffer": shuffle_buffer,
        "format": data_cfg.format,
    }
    timeout = data_cfg.worker_timeout_s if num_workers > 0 else 0  # torch's in-process path takes none
    return _loader(windows, batch_size, num_workers, fingerprint, timeout)


def _check_request(data_cfg: DataConfig, batch_size: int, dp_rank: int, dp_world_size: int) -> None:
    if not 0 <= dp_rank < dp_world_size:
        raise DataError(f"data: dp_rank {dp_rank} is outside dp_world_size {dp_world_size}")
    if batch_size <= 0:
        raise DataError(f"data: batch_size must be positive, got {batch_size}")
    if data_cfg.format not in FORMATS:  # a DataConfig built in code skips the config's checks
        raise DataError(f"data.format: must be one of {', '.join(FORMATS)}, got {data_cfg.format!r}")


def _conversation_encoder(data_cfg: DataConfig, tokenizer: Tokenizer) -> tuple[ConversationEncoder, str]:
    """data.format=chat: conversations rendered with the model's chat template, read from the messages column."""
    if not data_cfg.chat_template:
        raise DataError(
            "data.chat_template: required with data.format=chat (a model folder whose "
            "tokenizer_config.json holds the chat template)"
        )
    encoder = ConversationEncoder(load_template(str(data_cfg.chat_template)), tokenizer, eos_id(tokenizer))
    return encoder, CHAT_COLUMN


def _loader(
    windows: PackedWindows, batch_size: int, num_workers: int, fingerprint: dict, timeout: float = 0
) -> PackedDataLoader:
    with warnings.catch_warnings():  # torchdata 0.11 calls a torch API that torch 2.13 deprecated; nothing to act on
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return PackedDataLoader(
            windows,
            batch_size=batch_size,
            collate_fn=collate_windows,
            num_workers=num_workers,
            timeout=timeout,
            worker_init_fn=functools.partial(init_worker, trainer_pid=os.getpid()) if num_workers > 0 else None,
            multiprocessing_context=worker_context() if num_workers > 0 else None,  # workers.py: no fork of the trainer
            pin_memory=torch.cuda.is_available(),
            drop_last=True,
            fingerprint=fingerprint,
        )
