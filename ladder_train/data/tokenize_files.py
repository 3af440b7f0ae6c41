"""``ladder-data prepare``: a source tokenized once into a token folder (token_files.py), in parallel processes.

The work is cut along the source's own shards (its files: a hub dataset's parquet files, a local folder's files,
the standard library's modules), each shard one task. A task tokenizes its documents in order (the document
separator after each, as the packing path does) into a part file; the main process appends the parts to
``tokens.bin`` / ``offsets.bin`` in shard order as they finish, so the folder is byte for byte the same whatever
``--workers`` is. Everything is written inside ``OUT_DIR/.parts/`` and moved into place at the end, the metadata
file last; what OUT_DIR may hold before, ``--overwrite`` and the lock are out_folder.py's. A source of one file is one
task (one process).

Ctrl-C reaches the whole process group: the workers ignore it (they are started with SIGINT ignored, so not even
their start-up sees it), the main process stops them and removes its partial files, and KeyboardInterrupt goes on
to the caller (``ladder-data`` prints one line and exits 130).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from ..errors import DataError
from ..files import open_to_write, remove_written, replace_written
from .out_folder import PARTS, check_contents, check_out_dir, locked, remove_parts
from .packing import check_documents, document_groups, document_ids, separated
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

_report = None  # called with (documents, tokens) as a task advances: the progress bar's counters


def _documents(shard, column: str, source: str, split: str) -> Iterator[list]:
    """The shard's documents in groups (packing's), a read failure as one DataError line naming the file."""
    try:
        yield from document_groups(iter(shard), column)
    except DataError:
        raise
    except Exception as err:
        raise DataError(read_error_message(source, split, column, err)) from None


def _ids(texts: list, tokenizer: Tokenizer, separator: int, vocab_size: int, where: tuple) -> list[np.ndarray]:
    """Each document's ids (the separator not yet added); a column of token id lists is taken as it is. A document
    that is neither is the trainer's one line (packing.check_documents), naming its file and record; ``where`` is
    the (source, split, column) read."""
    source, split, column = where
    check_documents(texts, column, source, functools.partial(read_error_message, source, split, column))
    return document_ids(texts, tokenizer, vocab_size, source)


def _tokenize_shard(task: tuple) -> tuple[int, int, int]:
    """One task: shard ``index`` of the source -> ``PARTS/{index}.tokens`` and ``.lengths``; returns (documents,
    tokens, the largest id or -1)."""
    shard, index, tokenizer, column, source, split, dtype, parts = task
    separator, vocab_size = eos_id(tokenizer), tokenizer.get_vocab_size(with_added_tokens=True)
    n_docs = n_tokens = 0
    largest = -1
    with (
        open_to_write(parts / f"{index:06d}.tokens", "wb") as tokens,
        open_to_write(parts / f"{index:06d}.lengths", "wb") as lengths,
    ):
        for texts in _documents(shard, column, source, split):
            ids = _ids(texts, tokenizer, separator, vocab_size, (source, split, column))
            flat = separated(ids, separator, DTYPES[dtype])
            tokens.write(flat.tobytes())
            lengths.write(np.asarray([len(doc) + 1 for doc in ids], dtype=OFFSET_DTYPE).tobytes())
            n_docs, n_tokens = n_docs + len(ids), n_tokens + len(flat)
            largest = max(largest, int(flat.max())) if len(flat) else largest
            if _report is not None:
                _report(len(ids), len(flat))
    return n_docs, n_tokens, largest


def _count(counters, docs: int, tokens: int) -> None:
    with counters[0].get_lock():
        counters[0].value += docs
        counters[1].value += tokens


def _init_worker(counters) -> None:
    global _report
    _report = functools.partial(_count, counters)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one tokenizing thread per process: --workers sets the cores
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle (module docstring)


@contextmanager
def _started_ignoring_ctrl_c():
    """Processes started in the block begin with SIGINT ignored: an ignored signal stays ignored across exec, so a
    spawned worker's Python never installs its KeyboardInterrupt handler (a Ctrl-C during its imports would print
    a traceback). This process's own handler is back after the block."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signal handlers are not this thread's to set
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


class _Assembler:
    """Appends finished parts to .parts/tokens.bin and .parts/offsets.bin in shard order and deletes them."""

    def __init__(self, parts: Path):
        self.parts = parts
        self.tokens = open_to_write(parts / TOKENS_NAME, "wb")  # closed by close()
        self.offsets = open_to_write(parts / OFFSETS_NAME, "wb")
        self.offsets.write(np.zeros(1, dtype=OFFSET_DTYPE).tobytes())
        self.n_tokens = self.n_docs = 0
        self.largest = -1

    def append(self, index: int, largest: int) -> None:
        self.largest = max(self.largest, largest)
        part = self.parts / f"{index:06d}"
        with open(f"{part}.tokens", "rb") as source:
            shutil.copyfileobj(source, self.tokens, 1 << 24)
        lengths = np.fromfile(f"{part}.lengths", dtype=OFFSET_DTYPE)
        self.offsets.write((self.n_tokens + np.cumsum(lengths, dtype=np.int64)).astype(OFFSET_DTYPE).tobytes())
        self.n_tokens += int(lengths.sum())
        self.n_docs += len(lengths)
        remove_written(f"{part}.tokens")
        remove_written(f"{part}.lengths")

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
            assembler.append(task[1], _tokenize_shard(task)[2])
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
        with _started_ignoring_ctrl_c():
            pool = context.Pool(min(workers, len(tasks)), _init_worker, (counters,))
        with pool:  # its exit terminates the workers, also on Ctrl-C or an error
            results = pool.imap(_tokenize_shard, tasks)
            done = 0
            try:
                while done < len(tasks):
                    try:
                        result = results.next(timeout=1.0)
                    except mp.TimeoutError:
                        pass
                    else:
                        assembler.append(tasks[done][1], result[2])
                        done += 1
                        bar.update(1)
                    _postfix(bar, counters[0].value, counters[1].value)
            except KeyboardInterrupt:
                # multiprocessing's fd-sharing thread reports a worker killed while it fetched its shared counters
                # through sys.excepthook: after Ctrl-C that is expected, not a traceback for the user
                sys.excepthook = _quiet_lost_workers(sys.excepthook)
                raise
    finally:
        bar.close()


def _quiet_lost_workers(hook):
    def report(kind, value, traceback):
        if not issubclass(kind, (ConnectionResetError, BrokenPipeError, EOFError)):
            hook(kind, value, traceback)

    return report


def prepare(
    source: str,
    out_dir,
    tokenizer_name: str,
    split: str = "train",
    hub_config: str | None = None,
    text_column: str = "text",
    workers: int = 1,
    overwrite: bool = False,
) -> dict:
    """Tokenize ``source`` (anything ``data.source`` reads) into the token folder ``out_dir``; returns its metadata.
    Bad input (source, tokenizer, folder; out_folder.py says what OUT_DIR may hold) is one DataError line before any
    work. On any failure or Ctrl-C the partial files are removed (and OUT_DIR, when this call made it)."""
    out = Path(out_dir).expanduser()
    check_out_dir(out, overwrite)
    tokenizer = load_tokenizer(tokenizer_name, where="--tokenizer")
    documents = open_source(str(source), split, text_column, hub_config)
    identity = tokenizer_identity(tokenizer, tokenizer_name)
    dtype = token_dtype(identity["vocab_size"])
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked(out):
            check_contents(out, overwrite)  # again under the lock: another prepare may have written meanwhile
            remove_parts(out)  # an unfinished prepare's (checked: its own files only)
            (out / PARTS).mkdir()
            try:
                n = documents.num_shards
                tasks = [
                    (documents.shard(n, index), index, tokenizer, text_column, str(source), split, dtype, out / PARTS)
                    for index in range(n)
                ]
                assembler = _Assembler(out / PARTS)
                try:
                    _run_tasks(tasks, workers, assembler, f"tokenizing {source} ({split})")
                finally:
                    assembler.close()
                meta = _meta(source, split, hub_config, text_column, n, tokenizer, identity, dtype, assembler)
                _publish(out, meta)
            finally:
                remove_parts(out)
    except BaseException:
        if made and not any(out.iterdir()):
            out.rmdir()
        raise
    return meta


def _meta(source, split, hub_config, text_column, shards, tokenizer, identity, dtype, assembler) -> dict:
    hub = not (source == STDLIB_SOURCE or is_local(str(source)))
    return {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": identity,
        "separator_id": eos_id(tokenizer),
        "dtype": dtype,
        "tokens": assembler.n_tokens,
        "documents": assembler.n_docs,
        "max_token_id": assembler.largest if assembler.largest >= 0 else None,
        "source": {
            "name": str(source),
            "split": split,
            "hub_config": hub_config if hub else None,
            "text_column": text_column,
            "shards": shards,
        },
    }


def _publish(out: Path, meta: dict) -> None:
    """Move the assembled files from .parts into place, the metadata last. A run reading the folder being replaced
    keeps its own open files: a rename leaves them as they were, where writing in place would cut them short."""
    remove_written(out / TOKEN_FOLDER_META)  # the folder is incomplete until the new metadata is written
    for name in (TOKENS_NAME, OFFSETS_NAME):
        replace_written(out / PARTS / name, out / name)
    write_meta(out, meta)
