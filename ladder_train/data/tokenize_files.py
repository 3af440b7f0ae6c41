"""``ladder-data prepare``: a source tokenized once into a token folder (token_files.py), in parallel processes.

The work is cut along the source's own shards (its files: a hub dataset's parquet files, a local folder's files,
the standard library's modules), each shard one task. A task tokenizes its documents in order (the document
separator after each, as the packing path does) into a part file; the main process appends the parts to
``tokens.bin`` / ``offsets.bin`` in shard order as they finish, so the folder is byte for byte the same whatever
``--workers`` is. The metadata file is written last. A source of one file is one task (one process).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from .errors import DataError
from .packing import document_groups
from .sources import STDLIB_SOURCE, is_local, open_source, read_error_message
from .token_files import (
    DTYPES,
    FORMAT,
    OFFSET_DTYPE,
    OFFSETS_NAME,
    TOKEN_FOLDER_META,
    TOKENS_NAME,
    VERSION,
    token_dtype,
    tokenizer_identity,
    write_meta,
)
from .tokenizer import eos_id, load_tokenizer

PARTS = ".parts"  # the folder's scratch space while it is being written
_report = None  # called with (documents, tokens) as a task advances: the progress bar's counters


def _documents(shard, column: str, source: str, split: str) -> Iterator[list]:
    """The shard's documents in groups (packing's), a read failure as one DataError line naming the file."""
    try:
        yield from document_groups(iter(shard), column)
    except DataError:
        raise
    except Exception as err:
        raise DataError(read_error_message(source, split, column, err)) from None


def _ids(texts: list, tokenizer: Tokenizer, separator: int, vocab_size: int, source: str) -> list[list[int]]:
    """Each document's ids followed by the separator; a column of token id lists is taken as it is."""
    if any(not isinstance(text, (str, list)) for text in texts):
        odd = next(text for text in texts if not isinstance(text, (str, list)))
        raise DataError(f"{source}: a document is a {type(odd).__name__}, not text or token ids")
    if texts and isinstance(texts[0], str):
        ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts)]
    else:
        ids = [list(doc) for doc in texts]
        if any(doc and not 0 <= min(doc) <= max(doc) < vocab_size for doc in ids):
            raise DataError(
                f"{source}: a document of token ids holds an id outside the vocabulary (0..{vocab_size - 1})"
            )
    for doc in ids:
        doc.append(separator)
    return ids


def _tokenize_shard(task: tuple) -> tuple[int, int]:
    """One task: shard ``index`` of the source -> ``PARTS/{index}.tokens`` and ``.lengths``; returns (documents,
    tokens)."""
    shard, index, tokenizer, column, source, split, dtype, parts = task
    separator, vocab_size = eos_id(tokenizer), tokenizer.get_vocab_size(with_added_tokens=True)
    n_docs = n_tokens = 0
    with open(parts / f"{index:06d}.tokens", "wb") as tokens, open(parts / f"{index:06d}.lengths", "wb") as lengths:
        for texts in _documents(shard, column, source, split):
            ids = _ids(texts, tokenizer, separator, vocab_size, source)
            flat = np.fromiter(chain.from_iterable(ids), dtype=DTYPES[dtype], count=sum(map(len, ids)))
            tokens.write(flat.tobytes())
            lengths.write(np.asarray([len(doc) for doc in ids], dtype=OFFSET_DTYPE).tobytes())
            n_docs, n_tokens = n_docs + len(ids), n_tokens + len(flat)
            if _report is not None:
                _report(len(ids), len(flat))
    return n_docs, n_tokens


def _count(counters, docs: int, tokens: int) -> None:
    with counters[0].get_lock():
        counters[0].value += docs
        counters[1].value += tokens


def _init_worker(counters) -> None:
    global _report
    _report = functools.partial(_count, counters)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one tokenizing thread per process: --workers sets the cores


class _Assembler:
    """Appends finished parts to tokens.bin / offsets.bin in shard order and deletes them."""

    def __init__(self, out: Path, parts: Path):
        self.parts = parts
        self.tokens = open(out / TOKENS_NAME, "wb")
        self.offsets = open(out / OFFSETS_NAME, "wb")
        self.offsets.write(np.zeros(1, dtype=OFFSET_DTYPE).tobytes())
        self.n_tokens = self.n_docs = 0

    def append(self, index: int) -> None:
        part = self.parts / f"{index:06d}"
        with open(f"{part}.tokens", "rb") as source:
            shutil.copyfileobj(source, self.tokens, 1 << 24)
        lengths = np.fromfile(f"{part}.lengths", dtype=OFFSET_DTYPE)
        self.offsets.write((self.n_tokens + np.cumsum(lengths, dtype=np.int64)).astype(OFFSET_DTYPE).tobytes())
        self.n_tokens += int(lengths.sum())
        self.n_docs += len(lengths)
        os.remove(f"{part}.tokens")
        os.remove(f"{part}.lengths")

    def close(self) -> None:
        self.tokens.close()
        self.offsets.close()


def _postfix(bar, docs: int, tokens: int) -> None:
    bar.set_postfix(docs=f"{docs:,}", tokens=f"{tokens / 1e6:,.1f}M", refresh=False)
    bar.refresh()


def _in_process(tasks: list[tuple], assembler: _Assembler, bar) -> None:
    global _report
    totals, shown = [0, 0], [0.0]

    def report(docs: int, tokens: int) -> None:
        totals[0], totals[1] = totals[0] + docs, totals[1] + tokens
        if time.monotonic() - shown[0] > 1.0:
            shown[0] = time.monotonic()
            _postfix(bar, *totals)

    _report = report
    try:
        for task in tasks:
            _tokenize_shard(task)
            assembler.append(task[1])
            bar.update(1)
    finally:
        _report = None
    _postfix(bar, *totals)


def _run_tasks(tasks: list[tuple], workers: int, assembler: _Assembler, desc: str) -> None:
    """Run the tasks (in this process with one worker) and assemble their parts in order, with a progress bar of
    shards, documents and tokens."""
    bar = tqdm(total=len(tasks), desc=desc, unit=" shards", dynamic_ncols=True)
    try:
        if workers <= 1 or len(tasks) == 1:
            _in_process(tasks, assembler, bar)
            return
        context = mp.get_context("spawn")  # no fork of a process holding datasets' and torch's threads
        counters = (context.Value("q", 0), context.Value("q", 0))
        with context.Pool(min(workers, len(tasks)), _init_worker, (counters,)) as pool:
            results = pool.imap(_tokenize_shard, tasks)
            done = 0
            while done < len(tasks):
                try:
                    results.next(timeout=1.0)
                except mp.TimeoutError:
                    pass
                else:
                    assembler.append(tasks[done][1])
                    done += 1
                    bar.update(1)
                _postfix(bar, counters[0].value, counters[1].value)
    finally:
        bar.close()


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"OUT_DIR: {out} exists and is not a folder")
    if (out / TOKEN_FOLDER_META).exists():
        raise DataError(
            f"OUT_DIR: {out} already holds token files ({TOKEN_FOLDER_META}); remove it or choose another folder"
        )


def prepare(
    source: str,
    out_dir,
    tokenizer_name: str,
    split: str = "train",
    hub_config: str | None = None,
    text_column: str = "text",
    workers: int = 1,
) -> dict:
    """Tokenize ``source`` (anything ``data.source`` reads) into the token folder ``out_dir``; returns its metadata.
    Bad input (source, tokenizer, folder) is one DataError line before any work."""
    out = Path(out_dir).expanduser()
    _check_out_dir(out)
    tokenizer = load_tokenizer(tokenizer_name, where="--tokenizer")
    documents = open_source(str(source), split, text_column, hub_config)
    identity = tokenizer_identity(tokenizer, tokenizer_name)
    dtype = token_dtype(identity["vocab_size"])
    parts = out / PARTS
    shutil.rmtree(parts, ignore_errors=True)  # the scratch of an earlier, interrupted prepare
    parts.mkdir(parents=True)
    n = documents.num_shards
    tasks = [
        (documents.shard(n, index), index, tokenizer, text_column, str(source), split, dtype, parts)
        for index in range(n)
    ]
    assembler = _Assembler(out, parts)
    try:
        _run_tasks(tasks, workers, assembler, f"tokenizing {source} ({split})")
    finally:
        assembler.close()
        shutil.rmtree(parts, ignore_errors=True)
    hub = not (source == STDLIB_SOURCE or is_local(str(source)))
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": identity,
        "separator_id": eos_id(tokenizer),
        "dtype": dtype,
        "tokens": assembler.n_tokens,
        "documents": assembler.n_docs,
        "source": {
            "name": str(source),
            "split": split,
            "hub_config": hub_config if hub else None,
            "text_column": text_column,
            "shards": n,
        },
    }
    write_meta(out, meta)
    return meta
