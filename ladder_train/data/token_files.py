"""Token files: a source tokenized once (``ladder-data prepare``) into one flat array of token ids, read by memory map.

A token folder holds three files:

- ``tokens.bin``: every document's ids followed by the document separator, one document after another (the stream
  the packing path builds on the fly), little-endian ``uint16`` when the vocabulary fits in 65,536 ids, else
  ``uint32``;
- ``offsets.bin``: little-endian ``int64``, where each document starts in ``tokens.bin``, then the total (documents
  + 1 values: document d is ``tokens[offsets[d]:offsets[d + 1]]``, its separator included);
- ``ladder_tokens.json`` (:data:`TOKEN_FOLDER_META`), written last, so a folder without it is incomplete: the format and
  version, the tokenizer (name, sha256 of its JSON, vocabulary size), the separator id, the dtype, the token and
  document counts, and what was tokenized (source, split, hub config, column).

:func:`open_token_folder` checks a folder against its metadata (file sizes, offsets, the last separator) and maps it;
:func:`check_tokenizer` refuses a folder made with another tokenizer than ``data.tokenizer``. Each refusal is one
line naming the file or key (``DataError``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from ..folders import TOKEN_FOLDER_META
from .errors import DataError

TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
FORMAT, VERSION = "ladder-token-files", 1
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
OFFSET_DTYPE = np.dtype("<i8")
_OFFSET_CHUNK = 1 << 24  # offsets checked this many at a time (128 MiB of int64)
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
    """A checked token folder: its metadata and its tokens mapped read-only (nothing is read until used)."""

    path: Path
    meta: dict
    meta_sha256: str  # the identity a checkpoint records: the sha256 of the metadata file's bytes
    tokens: np.ndarray  # a read-only memmap (an empty array for an empty folder)

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    @property
    def separator_id(self) -> int:
        return int(self.meta["separator_id"])

    def offsets(self) -> np.ndarray:
        """The document offsets (documents + 1 values), mapped read-only."""
        return np.memmap(self.path / OFFSETS_NAME, dtype=OFFSET_DTYPE, mode="r")

    def n_instances(self, window: int) -> int:
        """How many whole windows of ``window`` tokens the stream holds (the tail shorter than one is not read)."""
        return self.n_tokens // window

    def windows(self, indices: np.ndarray, window: int) -> np.ndarray:
        """Instances ``indices`` (window i = tokens ``[i * window, (i + 1) * window)``) as int64, one row each."""
        out = np.empty((len(indices), window), dtype=np.int64)
        for row, index in enumerate(np.asarray(indices, dtype=np.int64).tolist()):
            out[row] = self.tokens[index * window : (index + 1) * window]
        return out


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
    path = folder / OFFSETS_NAME
    offsets = np.memmap(path, dtype=OFFSET_DTYPE, mode="r")
    if offsets[0] != 0 or offsets[-1] != meta["tokens"]:
        raise DataError(
            f"{path}: the offsets run from {int(offsets[0])} to {int(offsets[-1]):,}, but {TOKEN_FOLDER_META} says 0 to "
            f"{meta['tokens']:,} tokens"
        )
    for start in range(0, len(offsets) - 1 if every else 0, _OFFSET_CHUNK):
        chunk = np.asarray(offsets[start : start + _OFFSET_CHUNK + 1])
        if (np.diff(chunk) < 0).any():
            bad = start + int(np.argmax(np.diff(chunk) < 0))
            raise DataError(f"{path}: offset {bad + 1} ({int(offsets[bad + 1])}) is below offset {bad} (damaged)")


def open_token_folder(folder, where: str = "data.source", every_offset: bool = False) -> TokenFolder:
    """A token folder checked against its metadata and mapped; ``where`` is the key or flag that named it. The
    metadata, both file sizes, the first and last offsets and the last token are checked always; ``every_offset``
    (``ladder-data info``) also reads every offset."""
    folder = Path(str(folder)).expanduser()
    if not folder.is_dir():
        raise DataError(f"{where}: no such folder: {folder}")
    meta, digest = _read_meta(folder)
    dtype = DTYPES[meta["dtype"]]
    _check_size(folder / TOKENS_NAME, meta["tokens"], dtype, "tokens")
    _check_size(folder / OFFSETS_NAME, meta["documents"] + 1, OFFSET_DTYPE, "offsets")
    _check_offsets(folder, meta, every_offset)
    if meta["tokens"] == 0:
        return TokenFolder(folder, meta, digest, np.zeros(0, dtype=dtype))
    tokens = np.memmap(folder / TOKENS_NAME, dtype=dtype, mode="r")
    if int(tokens[-1]) != meta["separator_id"]:
        raise DataError(
            f"{folder / TOKENS_NAME}: the last token is {int(tokens[-1])}, not the document separator "
            f"{meta['separator_id']} (damaged, or not this metadata's file)"
        )
    return TokenFolder(folder, meta, digest, tokens)


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
    partial.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    partial.replace(path)
    return path


def describe(folder: TokenFolder) -> str:
    """One line about a folder: its counts, dtype and tokenizer."""
    meta = folder.meta
    tok = meta["tokenizer"]
    return (
        f"{folder.path}: {meta['tokens']:,} tokens in {meta['documents']:,} documents ({meta['dtype']}), tokenizer "
        f"'{tok.get('name')}' ({tok.get('vocab_size')} tokens, sha256 {str(tok.get('sha256'))[:12]}), separator "
        f"{meta['separator_id']}"
    )
