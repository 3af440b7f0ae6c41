"""Document sources, all read by ``datasets`` in streaming mode (one code path):

- a hub dataset by name (default ``HuggingFaceFW/fineweb-edu``, config ``sample-10BT``);
- local ``.parquet`` / ``.jsonl`` / ``.json`` files, or a folder of them (``train-*`` / ``validation-*`` file
  names select the split, as on the hub);
- ``python-stdlib``: the running Python's standard library ``.py`` files, one document per file, a corpus
  every machine has (offline smoke runs; every 20th file is held out as the validation split).

A token folder (``folders.is_token_folder``: ladder-data prepare's output) is not streamed: loader.py hands it to
token_loader.py.

Local files are checked before any worker starts (exists, not empty, UTF-8, has the text column) so a bad
file gives a one-line error naming it. In chat mode (``data.format: chat``) the column is ``messages``, a list of
``{role, content}`` messages (conversations.py); a bad row found later is reported with its file and line.
Which corpus and which tokenizer a run reads is noted once per job (``note``, used by tokenizer.py too).
"""

from __future__ import annotations

import codecs
import functools
import json
import logging
import os
import sysconfig
from pathlib import Path

import datasets
import pyarrow.parquet as pq

from ..errors import DataError
from ..folders import is_token_folder
from .conversations import CHAT_COLUMN, conversation_problem

log = logging.getLogger(__name__)

STDLIB_SOURCE = "python-stdlib"
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}  # file suffix -> datasets builder
SPLITS = ("train", "validation", "test")
_STDLIB_SKIP = {"test", "tests", "idle_test", "site-packages", "lib2to3"}  # test data holds deliberately odd encodings
_UTF8_CHUNK = 16 << 20
_noted: set[str] = set()


def note(logger: logging.Logger, message: str, *args) -> None:
    """A warning about the data setup (which corpus, which tokenizer) once per job, not once per rank (128
    lines at 16 x 8): global rank 0 only (RANK unset = one process), and each distinct line once per process
    (the validation loader opens its source again at every validation)."""
    if os.environ.get("RANK", "0") != "0":
        return
    text = message % args if args else message
    if text not in _noted:
        _noted.add(text)
        logger.warning(text)


def _check_utf8(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with path.open("rb") as f:
        while chunk := f.read(_UTF8_CHUNK):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: not UTF-8 (byte {offset + err.start}: {err.reason})") from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 (truncated character at the end)") from None


def _check_parquet(path: Path, text_column: str, chat: bool = False) -> None:
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as err:
        raise DataError(f"{path}: not a parquet file ({str(err).splitlines()[0]})") from None
    schema = meta.schema.to_arrow_schema()
    if text_column not in schema.names:
        raise DataError(f"{path}: no '{text_column}' column ({_key(chat)}); columns: {', '.join(schema.names)}")
    kind = str(schema.field(text_column).type)
    if chat:
        if not kind.startswith(("list<", "large_list<")):
            raise DataError(f"{path}: column '{text_column}' holds {kind}, not a list of {{role, content}} messages")
    elif kind not in ("string", "large_string") and not kind.startswith(("list<element: int", "list<item: int")):
        raise DataError(f"{path}: column '{text_column}' holds {kind}, not text (or token ids from data/prepare.py)")
    if meta.num_rows == 0:
        raise DataError(f"{path}: empty file (0 rows)")


def _key(chat: bool) -> str:
    """The setting that names the column, for messages."""
    return "data.format=chat" if chat else "data.text_column"


def _check_jsonl(path: Path, text_column: str, chat: bool = False) -> None:
    _check_utf8(path)
    with path.open(encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), None)
    if first is None:
        raise DataError(f"{path}: empty file (no records)")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: first record is not JSON ({err.msg}); expected one JSON object per line") from None
    if not isinstance(record, dict) or text_column not in record:
        keys = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{path}: no '{text_column}' key ({_key(chat)}) in the first record; keys: {keys}")
    if chat:
        if problem := conversation_problem(record[text_column]):
            raise DataError(f"{path}: the first record: {problem}")
    elif not (isinstance(record[text_column], str) or is_id_list(record[text_column])):
        kind = type(record[text_column]).__name__
        raise DataError(f"{path}: '{text_column}' holds {kind}, not text or a list of token ids")


def is_id_list(value) -> bool:
    """A pre-tokenized document: a list of token ids (integers), taken as it is (the guide's "Data")."""
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def check_file(path: Path, text_column: str, chat: bool = False) -> None:
    """One local data file, before anything reads it (in chat mode: its first conversation)."""
    if not path.is_file():
        raise DataError(f"data.source: no such file: {path}")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: empty file")
    if FORMATS.get(path.suffix) == "parquet":
        _check_parquet(path, text_column, chat)
    elif FORMATS.get(path.suffix) == "json":
        _check_jsonl(path, text_column, chat)
    elif chat:
        raise DataError(
            f"{path}: a {path.suffix or 'suffix-less'} file holds no conversations; data.format=chat reads .jsonl or .parquet"
        )
    else:  # plain text, one document per file (the stdlib corpus)
        _check_utf8(path)


def first_bad_record(files: list[Path], text_column: str) -> str | None:
    """'path: line N ...' for the first line of a local JSON-lines file that is not a JSON object holding
    ``text_column``; None if there is none. Only the first record is checked before a run (the files can be
    large), so this runs when reading fails later."""
    for path in files:
        if FORMATS.get(path.suffix) == "parquet":  # its column's type is checked before reading: only a null is bad
            if bad := _first_null_row(path, text_column):
                return bad
        if FORMATS.get(path.suffix) != "json":
            continue
        for number, record in _json_lines(path):
            if isinstance(record, json.JSONDecodeError):
                return f"{path}: line {number} is not JSON ({record.msg.removesuffix(' at')} at column {record.colno}); expected one JSON object per line"
            if not isinstance(record, dict) or text_column not in record:
                return f"{path}: line {number} has no '{text_column}' key (data.text_column)"
            if not isinstance(record[text_column], (str, list)):
                kind = "null" if record[text_column] is None else f"a {type(record[text_column]).__name__}"
                return f"{path}: line {number}: '{text_column}' is {kind}, not text (data.text_column)"
    return None


def _first_null_row(path: Path, text_column: str) -> str | None:
    """'path: row N ...' for the first row of a parquet file whose ``text_column`` is null; None if there is none, or
    when the file cannot be read that far (the caller then names the read failure itself)."""
    row = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(columns=[text_column], batch_size=1 << 16):
            column = batch.column(0)
            if column.null_count:
                first = row + int(column.is_null().to_numpy(zero_copy_only=False).argmax())
                return f"{path}: row {first} (counting from 0): '{text_column}' is null, not text (data.text_column)"
            row += len(column)
    except Exception:  # a damaged file: what failed is the reading, which the caller reports
        return None
    return None


def _json_lines(path: Path):
    """(line number, the parsed JSON or its JSONDecodeError) for each non-empty line of a JSON-lines file."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as err:
                    yield number, err


def first_bad_conversation(files: list[Path]) -> str | None:
    """'path: line N: why' for the first row of local chat files whose ``messages`` is not a conversation; None
    if there is none. Like first_bad_record, this runs when a bad row turns up while training reads."""
    for path in files:
        if FORMATS.get(path.suffix) == "json":
            for number, record in _json_lines(path):
                if isinstance(record, json.JSONDecodeError):
                    return f"{path}: line {number} is not JSON; expected one JSON object per line"
                messages = record.get(CHAT_COLUMN) if isinstance(record, dict) else None
                if problem := conversation_problem(messages):
                    return f"{path}: line {number}: {problem}"
        elif FORMATS.get(path.suffix) == "parquet":
            row = 0
            for batch in pq.ParquetFile(path).iter_batches(columns=[CHAT_COLUMN], batch_size=4096):
                for messages in batch.column(0).to_pylist():
                    if problem := conversation_problem(messages):
                        return f"{path}: row {row} (counting from 0): {problem}"
                    row += 1
    return None


def bad_row_message(source: str, split: str, reason: str) -> str:
    """One line for a row of ``source`` that is no conversation (``reason``): the file and line when the source
    is local and the row's fault is its shape, else the source and the reason."""
    if source != STDLIB_SOURCE and is_local(source):
        try:
            files = local_files(source, split)
        except DataError:
            files = []
        if bad := first_bad_conversation(files):
            return bad
    return f"data.source: {source} (split {split}): a conversation: {reason}"


def read_error_message(source: str, split: str, text_column: str, err: Exception) -> str:
    """One line for a failure while streaming ``source``: the bad file and line when a local file has one."""
    text = str(err).strip()
    reason = f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
    if source != STDLIB_SOURCE and is_local(source):
        try:
            files = local_files(source, split)
        except DataError:
            files = []
        if bad := first_bad_record(files, text_column):
            return bad
    return f"data.source: {source} (split {split}): reading documents failed ({reason})"


def _split_of(path: Path, root: Path) -> str | None:
    """'train' for train-00000-of-00004.parquet or train/x.parquet; None when the name names no split."""
    for part in path.relative_to(root).parts:
        for split in SPLITS:
            if part == split or part.startswith((f"{split}-", f"{split}_", f"{split}.")):
                return split
    return None


def local_files(source: str, split: str) -> list[Path]:
    """The files of a local source for ``split``, sorted (the stream order)."""
    root = Path(source).expanduser()
    if root.is_file() and is_token_folder(root.parent):
        raise DataError(
            f"data.source: {root} is a file of the token folder {root.parent}; give the folder: data.source={root.parent}"
        )
    if root.is_file() and root.suffix not in FORMATS:
        raise DataError(f"data.source: {root} is not a {'/'.join(FORMATS)} file (nor a folder of them)")
    if root.is_file():
        if split != "train":
            raise DataError(f"data.source: {root} is one file with no '{split}' split; set data.validation_source")
        files = [root]
    elif root.is_dir():
        found = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
        files = [p for p in found if p.suffix in FORMATS]
        if ignored := [p.name for p in found if p.suffix not in FORMATS]:
            note(log, "data: %s: ignoring %d non-data files: %s", root, len(ignored), ", ".join(ignored[:5]))
        if not files:
            raise DataError(f"data.source: {root} holds no {'/'.join(FORMATS)} files")
        named = {p: _split_of(p, root) for p in files}
        if any(named.values()):  # the folder names its splits: take the requested one
            files = [p for p in files if named[p] == split]
            if not files:
                present = sorted({s for s in named.values() if s})
                raise DataError(f"data.source: {root} has no '{split}' files (splits found: {', '.join(present)})")
        elif split != "train":
            raise DataError(f"data.source: {root} names no '{split}' split; set data.validation_source")
    else:
        raise DataError(f"data.source: no such file or folder: {root}")
    kinds = {FORMATS[p.suffix] for p in files}
    if len(kinds) > 1:
        raise DataError(f"data.source: {root} mixes formats ({', '.join(sorted(kinds))}); use one format per source")
    return files


@functools.cache
def _stdlib_py_files() -> tuple[Path, ...]:
    # the skipped folders are pruned, not walked: site-packages alone can hold ten times the library's files;
    # cached because the validation loader opens its split again at every validation
    files = []
    for folder, subfolders, names in os.walk(sysconfig.get_paths()["stdlib"]):
        subfolders[:] = [name for name in subfolders if name not in _STDLIB_SKIP]
        files += [Path(folder, name) for name in names if name.endswith(".py")]
    return tuple(sorted(files))


def stdlib_files(split: str) -> list[Path]:
    """The standard library's .py files (no test folders): every 20th is the validation split."""
    files = _stdlib_py_files()
    if split == "train":
        return [p for i, p in enumerate(files) if i % 20 != 19]
    if split == "validation":
        return [p for i, p in enumerate(files) if i % 20 == 19]
    raise DataError(f"data.source: {STDLIB_SOURCE} has splits train and validation, not '{split}'")


def is_local(source: str) -> bool:
    return source == STDLIB_SOURCE or source.startswith((".", "/", "~")) or Path(source).expanduser().exists()


def open_source(
    source: str, split: str, text_column: str, hub_config: str | None = None, chat: bool = False
) -> datasets.IterableDataset:
    """A streaming ``datasets.IterableDataset`` of the source's documents with the one column ``text_column``
    (with ``chat``, conversations: the column is ``messages``). Local files are validated first; every problem
    is a one-line DataError."""
    if chat:
        text_column = CHAT_COLUMN
        if source == STDLIB_SOURCE:
            raise DataError(f"data.source: {STDLIB_SOURCE} holds no conversations (data.format=chat)")
    if source == STDLIB_SOURCE:
        files = stdlib_files(split)
        for path in files:
            _check_utf8(path)
        stdlib = sysconfig.get_paths()["stdlib"]
        note(log, "data: corpus = %s: %d .py files of %s (split %s), not FineWeb", source, len(files), stdlib, split)
        docs = datasets.load_dataset(
            "text", data_files=[str(p) for p in files], sample_by="document", split="train", streaming=True
        )
        return docs.rename_column("text", text_column) if text_column != "text" else docs
    if is_local(source):
        files = local_files(source, split)
        for path in files:
            check_file(path, text_column, chat)
        note(log, "data: corpus = local %s: %d %s files (split %s)", source, len(files), files[0].suffix, split)
        docs = datasets.load_dataset(
            FORMATS[files[0].suffix], data_files=[str(p) for p in files], split="train", streaming=True
        )
        return docs.select_columns([text_column])
    try:
        docs = datasets.load_dataset(source, hub_config, split=split, streaming=True)
    except Exception as err:  # offline, unknown name, unknown config or split
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(
            f"data.source: could not open '{source}' (config {hub_config}, split {split}) locally or on the hub "
            f"({type(err).__name__}: {reason})"
        ) from None
    if docs.column_names is not None and text_column not in docs.column_names:
        raise DataError(
            f"data.source: '{source}' has no '{text_column}' column; columns: {', '.join(docs.column_names)}"
        )
    note(log, "data: corpus = hub %s (config %s, split %s, %d shards)", source, hub_config, split, docs.num_shards)
    return docs.select_columns([text_column])
