"""Loss and perplexity on held-out text: the in-training validation (``eval.val_every``) and ``ladder-eval
--val-data``. The loss is the token-weighted mean cross-entropy in fp32; perplexity = exp(loss)."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from ..data.packing import IGNORE_INDEX, PackedWindows, collate_windows
from ..data.sources import check_file, first_bad_record
from ..data.tokenizer import eos_id
from ..errors import DataError
from .adapter import EvalError

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".txt": "text"}


@torch.no_grad()
def scored_loss_sum(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """The summed cross-entropy (the training loss's, on fp32 logits; float64 sum) over every scored label (not -100)
    of ``batches`` ((inputs, labels), LongTensor (B, T)) and the number of those labels, which may be 0 (chat data:
    batches without an assistant token). Runs in eval mode and restores the model's mode afterwards."""
    device = next(model.parameters()).device
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    try:
        for inputs, labels in batches:
            inputs, labels = inputs.to(device), labels.to(device)
            with autocast:
                loss_sum = model(inputs, labels=labels)  # the training loss's own code (model.TokenLoss)
            total += loss_sum.double().cpu()
            count += int((labels != IGNORE_INDEX).sum())
    finally:
        model.train(was_training)
    return float(total), count


def validation_loss(model, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """Mean cross-entropy over every scored label token of ``batches`` ((inputs, labels), LongTensor (B, T);
    labels -100 are not scored) and the number of those tokens. Runs in eval mode and restores the model's
    mode afterwards."""
    total, count = scored_loss_sum(model, batches)
    if count == 0:
        raise EvalError("validation_loss: the batches hold no label tokens")
    return total / count, count


def perplexity(loss: float) -> float:
    return math.exp(loss)


def held_out_files(path: str | Path, text_column: str = "text") -> tuple[str, list[Path]]:
    """The datasets builder and files of held-out data (a parquet / jsonl / text file, or a folder of one kind),
    each checked as a training data file is (not empty, UTF-8, a readable parquet footer, the text column in the
    first record: ``data.check_file``), so bad data is one line naming the file before any model is loaded."""
    path = Path(path)
    if not path.exists():
        raise EvalError(f"--val-data {path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix in _BUILDERS) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise EvalError(f"validation data {path}: no .parquet, .jsonl or .txt file found")
    kinds = {_BUILDERS.get(f.suffix) for f in files}
    if None in kinds or len(kinds) != 1:
        raise EvalError(f"validation data {path}: expected files of one kind among {', '.join(_BUILDERS)}")
    for file in files:
        try:
            check_file(file, text_column)
        except DataError as err:
            raise EvalError(f"validation data {err}") from None
    return kinds.pop(), files


def held_out_batches(
    path: str | Path,
    tokenizer,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
    text_column: str = "text",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(inputs, labels) batches from a parquet / jsonl / text file (or a folder of one kind), packed by the
    training data's ``PackedWindows``: each document tokenized and followed by ``<|endoftext|>``, concatenated
    and cut into windows of ``seq_len + 1`` tokens. The incomplete last window and batch are dropped; data too
    short for one batch is an EvalError, as is a bad record (naming its file and line)."""
    from datasets import load_dataset

    builder, files = held_out_files(path, text_column)
    path = Path(path)
    dataset = load_dataset(builder, data_files=[str(f) for f in files], split="train", streaming=True)
    # the training data's own packing: documents + <|endoftext|>, one stream, windows of seq_len + 1
    windows = PackedWindows(
        dataset,
        tokenizer,
        seq_len,
        eos_id(tokenizer, where=f"validation data {path}"),
        text_column=text_column,
        cycle=False,
        source_name=f"validation data {path}",
        describe_read_error=functools.partial(_read_error, path, files, text_column),
    )
    group: list[torch.Tensor] = []
    produced = 0
    try:
        for window in windows:
            group.append(window)
            if len(group) == batch_size:
                yield collate_windows(group)
                group, produced = [], produced + 1
                if max_batches is not None and produced >= max_batches:
                    return
    except DataError as err:
        raise EvalError(str(err)) from None
    if produced == 0:
        raise EvalError(
            f"validation data {path}: too short for one batch of {batch_size} windows of {seq_len + 1} tokens "
            f"({len(group)} windows; lower --batch-size or --val-seq-len)"
        )


def _read_error(path: Path, files: list[Path], text_column: str, err: Exception) -> str:
    """One line for a failure while reading held-out data: the file and line of a bad record when one is found."""
    text = str(err).strip()
    reason = f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
    return first_bad_record(files, text_column) or f"validation data {path}: reading documents failed ({reason})"
