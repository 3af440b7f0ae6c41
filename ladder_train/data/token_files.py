"""Token files: a source tokenized once (``ladder-data prepare``) into one flat array of token ids, read in place.

A token folder holds three files:

- ``tokens.bin``: every document's ids followed by the document separator, one document after another (the stream
  the packing path builds on the fly), little-endian ``uint16`` when the vocabulary fits in 65,536 ids, else
  ``uint32``;
- ``offsets.bin``: little-endian ``int64``, where each document starts in ``tokens.bin``, then the total (documents
  + 1 values: document d is ``tokens[offsets[d]:offsets[d + 1]]``, its separator included);
- ``ladder_tokens.json`` (:data:`TOKEN_FOLDER_META`), written last, so a folder without it is incomplete: the format and
  version, the tokenizer (name, sha256 of its JSON, vocabulary size), the separator id, the dtype, the token and
  document counts, the largest token id (``max_token_id``; folders made before it was recorded lack it), and what
  was tokenized (source, split, hub config, column).

:func:`open_token_folder` checks a folder against its metadata (file sizes, offsets, the last separator) and opens it;
:func:`check_tokenizer` refuses a folder made with another tokenizer than ``data.tokenizer``;
:func:`check_token_ids` (``ladder-data info``) reads every token for the largest id. Each refusal is one line naming
the file or key (``DataError``).

Windows are read with ``os.pread`` from a file held open, not through a memory map: a ``tokens.bin`` cut short
while a run reads it is then a short read, one DataError line naming the file, where the map would fault (SIGBUS,
no message, no cleanup). Every window's ids are also checked against the vocabulary before they reach the model:
the metadata of a hand-made folder can lie, and an id past the embedding table is a bare IndexError (on CUDA a
device-side assert).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tokenizers import Tokenizer

from ..errors import DataError
from ..files import replace_written, write_text
from ..folders import TOKEN_FOLDER_META

TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
FORMAT, VERSION = "ladder-token-files", 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
OFFSET_DTYPE = np.dtype("<i8")
_OFFSET_CHUNK = 1 << 24  # offsets checked this many at a time (128 MiB of int64)
_TOKEN_CHUNK = 1 << 25  # tokens scanned this many at a time by check_token_ids (64-128 MiB)
_META_KEYS = {"tokenizer": dict, "separator_id": int, "dtype": str, "tokens": int, "documents": int}


def token_dtype(vocab_size: int) -> str:
    """``uint16`` when every id fits (a vocabulary of at most 65,536), else ``uint32``."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def tokenizer_identity(tokenizer: Tokenizer, name: str) -> dict:
    """What a token folder records of its tokenizer: the name it was given by, the sha256 of its serialised JSON
    (the same for the same tokenizer wherever it was loaded from) and the vocabulary size."""
    digest = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()
    return {"name": str(name), "sha256": digest, "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)}


@dataclass
class TokenFolder:
    """A checked token folder: its metadata, its tokens.bin held open, and a read-only map of it (nothing is read
    until used; the map is for inspection, reads go through :meth:`read`)."""

    path: Path
    meta: dict
    meta_sha256: str  # the identity a checkpoint records: the sha256 of the metadata file's bytes
    tokens: np.ndarray  # a read-only memmap (an empty array for an empty folder), for inspection; reads use ``file``
    file: BinaryIO | None = None  # tokens.bin, held open: windows are read from it with pread

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    @property
    def vocab_size(self) -> int:
        """The vocabulary of the folder's tokenizer: every id must lie below it (in training it is
        ``data.tokenizer``'s, which is ``model.vocab_size``)."""
        return int(self.meta["tokenizer"]["vocab_size"])

    @property
    def separator_id(self) -> int:
        return int(self.meta["separator_id"])

    def offsets(self) -> np.ndarray:
        """The document offsets (documents + 1 values), mapped read-only."""
        return np.memmap(self.path / OFFSETS_NAME, dtype=OFFSET_DTYPE, mode="r")

    def n_instances(self, window: int) -> int:
        """How many whole windows of ``window`` tokens the stream holds (the tail shorter than one is not read)."""
        return self.n_tokens // window

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` in the folder's dtype, read with pread (module docstring)."""
        tokens = np.empty(count, dtype=self.tokens.dtype)
        self._read_into(tokens, start)
        return tokens

    def _read_into(self, buffer: np.ndarray, start: int) -> None:
        """Fill ``buffer`` with the tokens from ``start`` on: a file cut short is a DataError here, not a SIGBUS."""
        path = self.path / TOKENS_NAME
        if self.file is None:
            self.file = open(path, "rb", buffering=0)  # noqa: SIM115 - held open while the folder is read
        view, done, offset = memoryview(buffer).cast("B"), 0, start * buffer.itemsize
        while done < len(view):
            got = os.preadv(self.file.fileno(), [view[done:]], offset + done)
            if got == 0:
                size = os.fstat(self.file.fileno()).st_size
                raise DataError(
                    f"{path}: cut short while being read: {size:,} bytes now, but {TOKEN_FOLDER_META} says "
                    f"{self.n_tokens:,} tokens of {buffer.itemsize} bytes (token {start + buffer.size - 1:,} was to be "
                    "read); restore the file or prepare the folder again"
                )
            done += got

    def windows(self, indices: np.ndarray, window: int) -> np.ndarray:
        """Instances ``indices`` (window i = tokens ``[i * window, (i + 1) * window)``) as int64, one row each; an
        id outside the vocabulary stops here, naming the file and the token's offset."""
        indices = np.asarray(indices, dtype=np.int64)
        raw = np.empty((len(indices), window), dtype=self.tokens.dtype)
        for row, index in enumerate(indices.tolist()):
            self._read_into(raw[row], index * window)  # straight into the batch: one copy, as the map's slicing
        if raw.size and raw.max() >= self.vocab_size:
            row, column = (int(k) for k in np.argwhere(raw >= self.vocab_size)[0])
            raise DataError(self._outside(int(indices[row]) * window + column, int(raw[row, column])))
        return raw.astype(np.int64)

    def _outside(self, offset: int, token_id: int) -> str:
        return (
            f"{self.path / TOKENS_NAME}: token {offset:,} is id {token_id}, outside the vocabulary of its tokenizer "
            f"'{self.meta['tokenizer'].get('name')}' (ids 0..{self.vocab_size - 1}, model.vocab_size in training); "
            "the folder was not made with this tokenizer: prepare it again"
        )

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _read_meta(folder: Path) -> tuple[dict, str]:
    path = folder / TOKEN_FOLDER_META
    if not path.is_file():
        raise DataError(
            f"{folder}: no {TOKEN_FOLDER_META}: not a token folder, or its ladder-data prepare did not finish"
        )
    raw = path.read_bytes()
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not JSON ({str(err).splitlines()[0]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f'{path}: not ladder-data metadata (no "format": "{FORMAT}")')
    if meta.get("version") != VERSION:
        raise DataError(f"{path}: format version {meta.get('version')!r}; this ladder-train reads version {VERSION}")
    for key, kind in _META_KEYS.items():
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise DataError(f"{path}: '{key}' is missing or not a {kind.__name__}")
    if meta["dtype"] not in DTYPES:
        raise DataError(f"{path}: dtype {meta['dtype']!r} is not one of {', '.join(DTYPES)}")
    if meta["tokens"] < 0 or meta["documents"] < 0:
        raise DataError(f"{path}: negative token or document count")
    vocab = meta["tokenizer"].get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        raise DataError(f"{path}: 'tokenizer.vocab_size' is missing or not a positive int (ids are checked against it)")
    largest = meta.get("max_token_id")
    if largest is not None and (not isinstance(largest, int) or isinstance(largest, bool) or largest < 0):
        raise DataError(f"{path}: 'max_token_id' is {largest!r}, not a token id")
    if largest is not None and largest >= vocab:
        raise DataError(
            f"{path}: max_token_id {largest} is outside the vocabulary of its tokenizer '{meta['tokenizer'].get('name')}' "
            f"(ids 0..{vocab - 1}): the folder was not made with this tokenizer; prepare it again"
        )
    return meta, hashlib.sha256(raw).hexdigest()


def _check_size(path: Path, count: int, dtype: np.dtype, what: str) -> None:
    if not path.is_file():
        raise DataError(f"{path}: missing ({what} of {path.parent / TOKEN_FOLDER_META})")
    expected, actual = count * dtype.itemsize, path.stat().st_size
    if actual != expected:
        state = "truncated" if actual < expected else "longer than its metadata says"
        raise DataError(
            f"{path}: {actual:,} bytes, but {TOKEN_FOLDER_META} says {count:,} {what} of {dtype.itemsize} bytes = "
            f"{expected:,} ({state})"
        )


def _check_offsets(folder: Path, meta: dict, every: bool) -> None:
    """offsets[0] = 0, offsets[-1] = the token count, and with ``every`` each offset at least the one before (read
    in chunks: 100B tokens are ~50M documents, 400 MB of offsets, which training does not read)."""
    path, count = folder / OFFSETS_NAME, meta["documents"] + 1
    with open(path, "rb", buffering=0) as file:  # read, not mapped: a file cut short meanwhile is no SIGBUS

        def offsets(start: int, n: int) -> np.ndarray:
            data = os.pread(file.fileno(), n * OFFSET_DTYPE.itemsize, start * OFFSET_DTYPE.itemsize)
            if len(data) < n * OFFSET_DTYPE.itemsize:
                raise DataError(f"{path}: cut short while being read (offset {start + n - 1:,} was to be read)")
            return np.frombuffer(data, dtype=OFFSET_DTYPE)

        first, last = int(offsets(0, 1)[0]), int(offsets(count - 1, 1)[0])
        if first != 0 or last != meta["tokens"]:
            raise DataError(
                f"{path}: the offsets run from {first} to {last:,}, but {TOKEN_FOLDER_META} says 0 to "
                f"{meta['tokens']:,} tokens"
            )
        for start in range(0, count - 1 if every else 0, _OFFSET_CHUNK):
            chunk = offsets(start, min(_OFFSET_CHUNK + 1, count - start))
            if (np.diff(chunk) < 0).any():
                bad = start + int(np.argmax(np.diff(chunk) < 0))
                raise DataError(
                    f"{path}: offset {bad + 1} ({int(chunk[bad + 1 - start])}) is below offset {bad} (damaged)"
                )


def open_token_folder(folder, where: str = "data.source", every_offset: bool = False) -> TokenFolder:
    """A token folder checked against its metadata and opened; ``where`` is the key or flag that named it. The
    metadata, both file sizes, the first and last offsets and the last token are checked always; ``every_offset``
    (``ladder-data info``) also reads every offset."""
    folder = Path(str(folder)).expanduser()
    if folder.is_file() and (folder.parent / TOKEN_FOLDER_META).is_file():
        raise DataError(f"{where}: {folder} is a file of the token folder {folder.parent}; give the folder")
    if not folder.is_dir():
        raise DataError(f"{where}: no such folder: {folder}")
    meta, digest = _read_meta(folder)
    dtype = DTYPES[meta["dtype"]]
    _check_size(folder / TOKENS_NAME, meta["tokens"], dtype, "tokens")
    _check_size(folder / OFFSETS_NAME, meta["documents"] + 1, OFFSET_DTYPE, "offsets")
    _check_offsets(folder, meta, every_offset)
    if meta["tokens"] == 0:
        return TokenFolder(folder, meta, digest, np.zeros(0, dtype=dtype))
    opened = TokenFolder(folder, meta, digest, np.memmap(folder / TOKENS_NAME, dtype=dtype, mode="r"))
    last = int(opened.read(meta["tokens"] - 1, 1)[0])
    if last != meta["separator_id"]:
        opened.close()
        raise DataError(
            f"{folder / TOKENS_NAME}: the last token is {last}, not the document separator "
            f"{meta['separator_id']} (damaged, or not this metadata's file)"
        )
    return opened


def check_token_ids(folder: TokenFolder) -> int | None:
    """The largest token id of ``folder``, from reading every token (``ladder-data info``; the metadata's
    ``max_token_id`` could lie); an id outside the vocabulary, or a recorded largest id that is not the one found,
    is a DataError naming the file. None for an empty folder."""
    largest = None
    for start in range(0, folder.n_tokens, _TOKEN_CHUNK):
        chunk = folder.read(start, min(_TOKEN_CHUNK, folder.n_tokens - start))
        top = int(chunk.max())
        if top >= folder.vocab_size:
            offset = start + int(np.argmax(chunk >= folder.vocab_size))
            raise DataError(folder._outside(offset, int(chunk[offset - start])))
        largest = top if largest is None else max(largest, top)
    recorded = folder.meta.get("max_token_id")
    if recorded is not None and recorded != largest:
        raise DataError(
            f"{folder.path / TOKEN_FOLDER_META}: max_token_id is {recorded}, but the largest id in {TOKENS_NAME} is "
            f"{largest} (damaged, or not this metadata's file)"
        )
    return largest


def check_tokenizer(folder: TokenFolder, tokenizer: Tokenizer, name: str, where: str = "data.tokenizer") -> None:
    """Stop when ``folder`` was made with another tokenizer than ``tokenizer`` (``data.tokenizer``): the same
    ids would mean other text."""
    made, now = folder.meta["tokenizer"], tokenizer_identity(tokenizer, name)
    if made.get("sha256") != now["sha256"] or made.get("vocab_size") != now["vocab_size"]:
        raise DataError(
            f"{folder.path / TOKEN_FOLDER_META}: tokenized with '{made.get('name')}' ({made.get('vocab_size')} tokens, sha256 "
            f"{str(made.get('sha256'))[:12]}), but {where} is '{name}' ({now['vocab_size']} tokens, sha256 "
            f"{now['sha256'][:12]}); use the tokenizer the folder was made with, or prepare it again"
        )


def write_meta(folder: Path, meta: dict) -> Path:
    """The metadata file, written last and atomically: its presence marks the folder complete."""
    path = folder / TOKEN_FOLDER_META
    partial = path.with_suffix(".json.partial")
    write_text(partial, json.dumps(meta, indent=1, sort_keys=True) + "\n")
    replace_written(partial, path)
    return path


def describe(folder: TokenFolder, largest: int | None = None) -> str:
    """One line about a folder: its counts, dtype, tokenizer, separator and largest id (``largest``, else the
    recorded one, if any)."""
    meta = folder.meta
    tok = meta["tokenizer"]
    largest = meta.get("max_token_id") if largest is None else largest
    return (
        f"{folder.path}: {meta['tokens']:,} tokens in {meta['documents']:,} documents ({meta['dtype']}), tokenizer "
        f"'{tok.get('name')}' ({tok.get('vocab_size')} tokens, sha256 {str(tok.get('sha256'))[:12]}), separator "
        f"{meta['separator_id']}" + (f", largest id {largest}" if largest is not None else "")
    )
