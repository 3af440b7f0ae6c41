"""The tokenizer: StarCoder's byte-level BPE (``bigcode/starcoder``) from the hub or a local ``tokenizer.json``,
or ``byte``, a 257-token byte-level tokenizer built in memory for offline smoke runs.

Every tokenizer here has ``<|endoftext|>``: it is appended after each document (id 0 for StarCoder and ``byte``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from ..errors import DataError
from ..files import is_plain_file
from ..folders import TOKENIZER_FILE
from .model_files import checkpoint_run_config
from .sources import note

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
# the end-of-document token of each tokenizer family, in this order: StarCoder / GPT-2 (SmolLM2 too), Llama 3,
# Llama 2 and other SentencePiece models
DOCUMENT_SEPARATORS = (EOS_TOKEN, "<|end_of_text|>", "</s>")
BYTE_TOKENIZER = "byte"  # data.tokenizer value of the built-in byte-level tokenizer (needs no download)


def _byte_to_char() -> list[str]:
    """The byte -> printable character table of byte-level BPE (the alphabet ``ByteLevel`` pre-tokenizes into):
    printable Latin-1 bytes stand for themselves, the others are moved to code points from 256 on."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    chars, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + shifted))
            shifted += 1
    return chars


def byte_tokenizer() -> Tokenizer:
    """``<|endoftext|>`` = 0, then byte b = b + 1: a vocabulary of 257 that any machine can build."""
    vocab = {EOS_TOKEN: 0} | {char: byte + 1 for byte, char in enumerate(_byte_to_char())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    return tokenizer


def _from_file(path: Path, where: str) -> Tokenizer:
    if path.is_dir():
        path = path / "tokenizer.json"
    if not is_plain_file(path):  # a FIFO or device: one line naming it, unopened
        raise DataError(f"{where}: no such file: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust parser's message names the JSON position
        raise DataError(f"{where}: {path} is not a tokenizers tokenizer.json ({str(err).splitlines()[0]})") from None


def _from_hub(name: str, where: str) -> Tokenizer:
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(name, "tokenizer.json")
    except Exception as err:  # offline, gated (bigcode/starcoder needs an accepted license + HF_TOKEN), or unknown
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(
            f"{where}: could not download '{name}' tokenizer.json from the hub ({type(err).__name__}: {reason}); "
            f"offline, pass a local file (path/to/tokenizer.json) or {BYTE_TOKENIZER}"
        ) from None
    return _from_file(Path(path), where)


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.endswith(".json") or Path(name).exists()


def load_tokenizer(name_or_path: str | Path, where: str = "data.tokenizer") -> Tokenizer:
    """The one tokenizer loader (training, export, ladder-eval): ``byte``, a local ``tokenizer.json`` (or a
    folder holding one), or a hub name. Logs which one was used. Raises DataError (one line, naming ``where``,
    the key or flag the name came from) if it cannot be had or has no document separator (``eos_id``)."""
    name = str(name_or_path)
    if name == BYTE_TOKENIZER:
        tokenizer = byte_tokenizer()
        note(log, "data: tokenizer = built-in byte-level tokenizer (257 tokens, <|endoftext|> = 0), not StarCoder")
    elif _looks_like_path(name):
        tokenizer = _from_file(Path(name).expanduser(), where)
        note(log, "data: tokenizer = local file %s (%d tokens)", name, tokenizer.get_vocab_size())
    else:
        tokenizer = _from_hub(name, where)
        note(log, "data: tokenizer = hub %s (%d tokens)", name, tokenizer.get_vocab_size())
    eos_id(tokenizer, where=f"{where} {name}")  # fail now, not in a worker
    return tokenizer


def eos_id(tokenizer: Tokenizer, where: str = "data.tokenizer") -> int:
    """The id of the document separator: the first of DOCUMENT_SEPARATORS the vocabulary has."""
    for token in DOCUMENT_SEPARATORS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise DataError(f"{where}: the tokenizer has none of {', '.join(DOCUMENT_SEPARATORS)} to separate documents")


def check_vocab(tokenizer: Tokenizer, model_vocab_size: int, where: str = "model.vocab_size") -> None:
    """Stop before training when the model's embedding table and the tokenizer disagree."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size != model_vocab_size:
        raise DataError(
            f"{where}: the model's vocabulary is {model_vocab_size} but the tokenizer has {size} tokens; "
            f"set model.vocab_size={size} or use the matching tokenizer"
        )


def model_tokenizer(model: str | Path, override: str | None = None) -> tuple[Tokenizer, str]:
    """The tokenizer of a saved model and where it came from (for messages); ladder-eval and ladder-generate
    both resolve it here. ``override`` (their ``--tokenizer``) wins; else the folder's own ``tokenizer.json`` (a
    Hugging Face folder, or an export: ladder-export copies the run's tokenizer into it); else, for a training
    checkpoint ``RUN_DIR/checkpoints/step-N``, the run's ``data.tokenizer`` in ``RUN_DIR/config.yaml``.
    Raises DataError (one line) when there is none."""
    if override is not None:
        return load_tokenizer(override, where="--tokenizer"), str(override)
    folder = Path(model)
    if is_plain_file(folder / TOKENIZER_FILE):
        return load_tokenizer(folder / TOKENIZER_FILE, where=str(folder)), str(folder / TOKENIZER_FILE)
    found = checkpoint_run_config(folder)
    if found is not None:
        run_config, cfg = found
        return load_tokenizer(cfg.data.tokenizer, where=f"{run_config} data.tokenizer"), str(cfg.data.tokenizer)
    raise DataError(f"{folder}: no {TOKENIZER_FILE} inside; pass --tokenizer PATH_OR_NAME (e.g. bigcode/starcoder)")
