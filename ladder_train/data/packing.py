"""Packing: documents -> token ids + ``<|endoftext|>`` -> one stream -> windows of ``seq_len + 1`` tokens.

:class:`PackedWindows` is a torch ``IterableDataset`` over a streaming ``datasets.IterableDataset``. It runs in
the data loader's workers (each reads its own shards), tokenizes documents in groups (one
``encode_batch_fast`` call per group), and is ``Stateful``: its state is the document stream's own
``state_dict`` plus the tokens already cut from those documents but not yet emitted (an int32 array), plus
the epoch. Restoring it continues with exactly the windows an uninterrupted run would have produced.

With ``shuffle_buffer = B > 0`` the documents are read in consecutive blocks of B and each block is emitted in
a permutation drawn from ``(seed, epoch, block number)``. The state then holds the stream's position at the
block's start and how many of the block's documents were taken: a resume re-reads that block (B documents, no
tokenizing), permutes it the same way and skips what was taken. So the state stays a few numbers, unlike a
rolling buffer's (``datasets``' own shuffle buffer is not saved in its state: a resume would refill it with
other documents).

Chat mode (``encoder``, a :class:`~ladder_train.data.conversations.ConversationEncoder`): the documents are
conversations, and beside the token stream runs a parallel stream of target flags (True = the token is
scored, see conversations.py), cut at the same places and saved in the state beside the tokens (``mask``).
A window is then the pair (tokens, targets): targets are the tokens with -100 where the flag is off.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer

from ..errors import DataError
from ..model import IGNORE_INDEX  # the label of a token that is not scored, the model's loss's
from .conversations import BadConversation, ConversationEncoder
from .long_text import text_ids

# one encode_batch call takes documents until either bound: enough to amortize the call, and few enough tokens
# pending that the state (sent with every batch from a worker) stays small
DOCS_PER_ENCODE = 64
CHARS_PER_ENCODE = 1 << 17


def _chars(value) -> int:
    """About how many characters a document holds: a text, token ids (~4 characters a token) or a conversation."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        if value and isinstance(value[0], dict):  # a conversation's messages
            return sum(len(m["content"]) for m in value if isinstance(m, dict) and isinstance(m.get("content"), str))
        return 4 * len(value)
    return 0


def document_groups(stream: Iterator[dict], column: str) -> Iterator[list]:
    """The documents (texts, token ids or conversations) in groups of at most DOCS_PER_ENCODE documents / about
    CHARS_PER_ENCODE characters."""
    group, chars = [], 0
    for example in stream:
        text = example[column]
        group.append(text)
        chars += _chars(text)
        if len(group) == DOCS_PER_ENCODE or chars >= CHARS_PER_ENCODE:
            yield group
            group, chars = [], 0
    if group:
        yield group


def check_documents(texts: list, column: str, where: str, describe: Callable[[Exception], str] | None = None) -> None:
    """Refuse a group of documents holding one that is neither text nor token ids: null, which is also what a record
    without ``column`` gives, or another type (a number). ``describe`` turns the reason into the line naming the
    file and record (sources.read_error_message); without it, or when it finds none, the line names ``where``. The
    trainer's packing and ladder-data prepare both ask this."""
    odd = next((text for text in texts if not isinstance(text, (str, list))), texts)
    if odd is texts:
        return
    kind = "null (or missing)" if odd is None else f"a {type(odd).__name__}"
    err = TypeError(f"a document's '{column}' is {kind}, not text or token ids")
    raise DataError(describe(err) if describe else f"{where}: {err}")


def document_ids(texts: list, tokenizer: Tokenizer, vocab_size: int, where: str) -> list[np.ndarray]:
    """Each document's token ids, int32: texts are tokenized (a long one in pieces that change no token:
    long_text.py); lists of token ids (a pre-tokenized column) are taken as they are, once every id is found inside
    the vocabulary (an id past it would index past the embedding table)."""
    if all(isinstance(text, str) for text in texts):
        return text_ids(texts, tokenizer)
    if not all(isinstance(text, list) for text in texts):
        raise DataError(f"{where}: the column mixes texts and token id lists; give one or the other")
    docs = []
    for doc in texts:
        try:
            ids = np.asarray(doc)
        except ValueError:  # a ragged list of lists
            ids = np.asarray([None])
        if ids.size and (ids.ndim != 1 or ids.dtype.kind not in "iu"):
            raise DataError(f"{where}: a document is a list, but not of token ids (integers)")
        if ids.size and not 0 <= ids.min() <= ids.max() < vocab_size:
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DataError(
                f"{where}: a document of token ids holds id {bad}, outside the tokenizer's vocabulary (0..{vocab_size - 1})"
            )
        docs.append(ids.astype(np.int32))
    return docs


def separated(ids: list[np.ndarray], separator: int, dtype=np.int32) -> np.ndarray:
    """The documents' ids, each followed by ``separator``, as one array of ``dtype``."""
    end = np.asarray([separator], dtype=np.int32)
    return np.concatenate([part for doc in ids for part in (doc, end)]).astype(dtype, copy=False)


class PackedWindows(torch.utils.data.IterableDataset):
    """Windows of ``seq_len + 1`` token ids (LongTensor) cut from the concatenated documents.

    ``cycle=True`` starts the documents again when they run out (``epoch`` counts the passes; the token buffer
    carries over, so no token is dropped at an epoch boundary). ``cycle=False`` makes one pass and drops the
    final partial window. ``shuffle_buffer`` > 0 permutes the documents in blocks of that many (module docstring).
    With ``encoder`` (chat mode) the ``text_column`` holds conversations and each window is a pair
    (tokens, targets); ``describe_bad_row`` turns the reason a row is not a conversation into the one line that
    says where it is.
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
        shuffle_buffer: int = 0,
        seed: int = 0,
        describe_read_error: Callable[[Exception], str] | None = None,
        encoder: ConversationEncoder | None = None,
        describe_bad_row: Callable[[str], str] | None = None,
    ):
        super().__init__()
        self.encoder = encoder
        self.describe_bad_row = describe_bad_row
        self.describe_read_error = describe_read_error  # error while streaming -> one line naming file and line
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.documents = documents
        self.tokenizer = tokenizer
        self.window = seq_len + 1
        self.eos_id = eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)  # pre-tokenized ids are checked against it
        self.text_column = text_column
        self.cycle = cycle
        self.source_name = source_name  # for error messages
        self._start: dict[str, Any] | None = None  # a loaded state the next iteration starts from
        self._live: dict[str, Any] | None = None  # the running iteration's position (read by state_dict)

    def state_dict(self) -> dict[str, Any]:
        if self._live is None:  # not iterating: the state the next iteration starts from
            return copy.deepcopy(self._start) if self._start else self._initial_state(self.encoder is not None)
        live = self._live
        state = {"epoch": live["epoch"], "buffer": live["buffer"][live["pos"] :].copy()}
        if self.encoder is not None:
            state["mask"] = live["mask"][live["pos"] :].copy()
        if self.shuffle_buffer:  # the stream position of the current block's start (None: the epoch's start)
            state.update(documents=copy.deepcopy(live["block_start"]), block=live["block"], taken=live["taken"])
        else:
            state["documents"] = live["docs"].state_dict()
        return state

    @staticmethod
    def _initial_state(chat: bool = False) -> dict[str, Any]:
        state = {"epoch": 0, "documents": None, "buffer": np.zeros(0, dtype=np.int32)}
        if chat:
            state["mask"] = np.zeros(0, dtype=bool)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = copy.deepcopy(state)
        self._live = None

    def _tokenize(self, texts: list[str]) -> np.ndarray:
        """The documents' ids, each followed by <|endoftext|>, as one int32 array."""
        check_documents(texts, self.text_column, self.source_name, self.describe_read_error)
        return separated(document_ids(texts, self.tokenizer, self.vocab_size, self.source_name), self.eos_id)

    def _encode(self, conversations: list) -> tuple[np.ndarray, np.ndarray]:
        """Chat mode: the conversations' ids and target flags; a row that is no conversation is one DataError."""
        try:
            return self.encoder.encode(conversations)
        except BadConversation as err:
            reason = str(err)
            raise DataError(
                self.describe_bad_row(reason) if self.describe_bad_row else f"{self.source_name}: a row: {reason}"
            ) from None

    def _reading(self, stream: Iterator[dict]) -> Iterator[dict]:
        """The document stream, with a read failure (a malformed line deep in a file) as one DataError line."""
        try:
            yield from stream
        except DataError:
            raise
        except Exception as err:
            text = str(err).strip()
            message = (
                self.describe_read_error(err)
                if self.describe_read_error
                else f"{self.source_name}: reading documents failed ({type(err).__name__}: "
                f"{text.splitlines()[0] if text else ''})"
            )
            raise DataError(message) from None

    def _shuffled(self, docs, live, block_start, block: int, taken: int) -> Iterator[dict]:
        """The documents of one epoch, each block of ``shuffle_buffer`` permuted; ``live`` tracks the block's
        start position, number and documents taken (counted as they are handed out, before the yield)."""
        stream = iter(docs)
        while documents := list(islice(stream, self.shuffle_buffer)):
            order = np.random.default_rng([self.seed % 2**32, live["epoch"], block]).permutation(len(documents))
            live.update(block_start=block_start, block=block, taken=taken)
            for i in order[taken:]:
                live["taken"] += 1
                yield documents[i]
            block_start, block, taken = copy.deepcopy(docs.state_dict()), block + 1, 0

    def __iter__(self):
        chat = self.encoder is not None
        start, self._start = self._start or self._initial_state(chat), None
        if chat and "mask" not in start:
            raise DataError(
                f"{self.source_name}: the loader state was saved for text data (data.format=text), not chat"
            )
        block, taken = start.get("block", 0), start.get("taken", 0)
        epoch, resumed = start["epoch"], start["documents"] is not None or taken > 0
        docs = copy.deepcopy(self.documents)  # the loaded stream position must not leak into a later iteration
        docs.set_epoch(epoch)
        if start["documents"] is not None:
            docs.load_state_dict(start["documents"])
        buffer = np.asarray(start["buffer"], dtype=np.int32)
        live = self._live = {"epoch": epoch, "docs": docs, "buffer": buffer, "pos": 0}
        if chat:
            live["mask"] = np.asarray(start["mask"], dtype=bool)
        live.update(block_start=start["documents"], block=block, taken=taken)
        window = self.window
        while True:
            n_docs = 0
            if self.shuffle_buffer:
                stream = self._shuffled(docs, live, live["block_start"], live["block"], live["taken"])
            else:
                stream = iter(docs)
            for texts in document_groups(self._reading(stream), self.text_column):
                n_docs += len(texts)
                if chat:
                    ids, flags = self._encode(texts)
                    mask = live["mask"] = np.concatenate([live["mask"], flags])
                else:
                    ids = self._tokenize(texts)
                buffer = np.concatenate([live["buffer"], ids])
                live["buffer"], pos = buffer, 0
                while len(buffer) - pos >= window:
                    out = torch.from_numpy(buffer[pos : pos + window].astype(np.int64))
                    if chat:
                        targets = torch.from_numpy(np.where(mask[pos : pos + window], out.numpy(), IGNORE_INDEX))
                        out = (out, targets)
                    pos += window
                    live["pos"] = pos  # the state at this yield: everything before pos is emitted
                    yield out
                live["buffer"], live["pos"] = buffer[pos:], 0
                if chat:
                    live["mask"] = mask[pos:]
            if not self.cycle or (n_docs == 0 and not resumed):  # one pass, or this worker has no documents
                return
            epoch, resumed = epoch + 1, False
            docs.set_epoch(epoch)
            live.update(epoch=epoch, block_start=None, block=0, taken=0)


def collate_windows(windows: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels), each (batch, seq_len): the labels are the inputs shifted by one token. Chat windows
    ((tokens, targets) pairs): the labels are the targets shifted by one, -100 where a token is not scored."""
    if isinstance(windows[0], tuple):
        tokens, targets = (torch.stack(part) for part in zip(*windows, strict=True))
        return tokens[:, :-1].contiguous(), targets[:, 1:].contiguous()
    batch = torch.stack(windows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
