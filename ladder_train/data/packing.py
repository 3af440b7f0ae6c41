"""Packing: documents -> token ids + ``<|endoftext|>`` -> one stream -> windows of ``seq_len + 1`` tokens.

:class:`PackedWindows` is a torch ``IterableDataset`` over a streaming ``datasets.IterableDataset``. It runs in
the data loader's workers (each reads its own shards), tokenizes documents in groups (one
``encode_batch_fast`` call per group), and is ``Stateful``: its state is the document stream's own
``state_dict`` plus the tokens already cut from those documents but not yet emitted (an int32 array), plus
the epoch. Restoring it continues with exactly the windows an uninterrupted run would have produced.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import chain
from typing import Any

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer

from .tokenizer import DataError

# one encode_batch call takes documents until either bound: enough to amortize the call, and few enough tokens
# pending that the state (sent with every batch from a worker) stays small
DOCS_PER_ENCODE = 64
CHARS_PER_ENCODE = 1 << 17


def document_groups(stream: Iterator[dict], column: str) -> Iterator[list[str]]:
    """The documents' texts in groups of at most DOCS_PER_ENCODE documents / about CHARS_PER_ENCODE characters."""
    group, chars = [], 0
    for example in stream:
        text = example[column]
        group.append(text)
        chars += len(text) * (1 if isinstance(text, str) else 4) if text is not None else 0  # ~4 characters a token
        if len(group) == DOCS_PER_ENCODE or chars >= CHARS_PER_ENCODE:
            yield group
            group, chars = [], 0
    if group:
        yield group


class PackedWindows(torch.utils.data.IterableDataset):
    """Windows of ``seq_len + 1`` token ids (LongTensor) cut from the concatenated documents.

    ``cycle=True`` starts the documents again when they run out (``epoch`` counts the passes; the token buffer
    carries over, so no token is dropped at an epoch boundary). ``cycle=False`` makes one pass and drops the
    final partial window.
    """

    def __init__(
        self,
        documents: datasets.IterableDataset,
        tokenizer: Tokenizer,
        seq_len: int,
        eos_id: int,
        text_column: str = "text",
        cycle: bool = True,
        source_name: str = "data.source",
    ):
        super().__init__()
        self.documents = documents
        self.tokenizer = tokenizer
        self.window = seq_len + 1
        self.eos_id = eos_id
        self.text_column = text_column
        self.cycle = cycle
        self.source_name = source_name  # for error messages
        self._start: dict[str, Any] | None = None  # a loaded state the next iteration starts from
        self._live: dict[str, Any] | None = None  # the running iteration's position (read by state_dict)

    def state_dict(self) -> dict[str, Any]:
        if self._live is None:  # not iterating: the state the next iteration starts from
            return copy.deepcopy(self._start) if self._start else self._initial_state()
        live = self._live
        return {
            "epoch": live["epoch"],
            "documents": live["docs"].state_dict(),
            "buffer": live["buffer"][live["pos"] :].copy(),
        }

    @staticmethod
    def _initial_state() -> dict[str, Any]:
        return {"epoch": 0, "documents": None, "buffer": np.zeros(0, dtype=np.int32)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = copy.deepcopy(state)
        self._live = None

    def _tokenize(self, texts: list[str]) -> np.ndarray:
        """The documents' ids, each followed by <|endoftext|>, as one int32 array."""
        if any(text is None for text in texts):
            raise DataError(f"{self.source_name}: a document has no '{self.text_column}' value (null)")
        if isinstance(texts[0], str):
            ids = [encoding.ids for encoding in self.tokenizer.encode_batch_fast(texts)]
        else:  # pre-tokenized documents (data/prepare.py): a column of token id lists
            ids = [list(doc) for doc in texts]
        for doc in ids:
            doc.append(self.eos_id)
        return np.fromiter(chain.from_iterable(ids), dtype=np.int32, count=sum(map(len, ids)))

    def __iter__(self):
        start, self._start = self._start or self._initial_state(), None
        epoch, resumed = start["epoch"], start["documents"] is not None
        docs = copy.deepcopy(self.documents)  # the loaded stream position must not leak into a later iteration
        docs.set_epoch(epoch)
        if resumed:
            docs.load_state_dict(start["documents"])
        buffer = np.asarray(start["buffer"], dtype=np.int32)
        live = self._live = {"epoch": epoch, "docs": docs, "buffer": buffer, "pos": 0}
        window = self.window
        while True:
            n_docs = 0
            for texts in document_groups(iter(docs), self.text_column):
                n_docs += len(texts)
                buffer = np.concatenate([live["buffer"], self._tokenize(texts)])
                live["buffer"], pos = buffer, 0
                while len(buffer) - pos >= window:
                    out = torch.from_numpy(buffer[pos : pos + window].astype(np.int64))
                    pos += window
                    live["pos"] = pos  # the state at this yield: everything before pos is emitted
                    yield out
                live["buffer"], live["pos"] = buffer[pos:], 0
            if not self.cycle or (n_docs == 0 and not resumed):  # one pass, or this worker has no documents
                return
            epoch, resumed = epoch + 1, False
            docs.set_epoch(epoch)
            live["epoch"] = epoch


def collate_windows(windows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (batch, seq_len): the labels are the inputs shifted by one token."""
    batch = torch.stack(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
