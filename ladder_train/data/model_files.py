"""A saved model's tokenizer files: where its tokenizer_config.json is (in its folder, or for a training checkpoint
where its run took it from) and the tokens generation stops at."""

from __future__ import annotations

from pathlib import Path

from ..config import load_config
from ..errors import InputError
from ..files import is_plain_file
from ..folders import (
    CHECKPOINT_KINDS,
    CONFIG_JSON,
    GENERATION_CONFIG,
    TOKENIZER_CONFIG,
    folder_kind,
    read_optional_json,
    run_config_path,
)


def checkpoint_run_config(folder: Path):
    """``(path, config)`` of the run a checkpoint folder belongs to, or None (not a checkpoint, or no config)."""
    run_config = run_config_path(folder)
    if folder_kind(folder) in CHECKPOINT_KINDS and is_plain_file(run_config):
        return run_config, load_config(run_config)
    return None


def run_tokenizer_config_folder(data_cfg) -> Path | None:
    """The folder a training run took its tokenizer_config.json from (chat template, eos token): data.chat_template,
    else the folder of a local data.tokenizer file (a model adapted with checkpoint.init_from); None if neither."""
    folders = [Path(data_cfg.chat_template)] if data_cfg.chat_template else []
    folders.append(Path(data_cfg.tokenizer).parent)
    return next((folder for folder in folders if is_plain_file(folder / TOKENIZER_CONFIG)), None)


def tokenizer_config_folder(model: str | Path) -> Path:
    """Where a saved model's tokenizer_config.json is: in its folder, or for a training checkpoint
    (RUN_DIR/checkpoints/step-N) where its run took it from. The model's own folder when there is none."""
    model = Path(model)
    if is_plain_file(model / TOKENIZER_CONFIG):
        return model
    found = checkpoint_run_config(model)
    return (run_tokenizer_config_folder(found[1].data) or model) if found is not None else model


def stop_tokens(folder: Path, tokenizer, vocab_size: int) -> tuple[list[int], str]:
    """The end-of-sequence ids generation stops at and where they were found: the eos_token of
    tokenizer_config.json, else eos_token_id of generation_config.json, else of config.json, else <|endoftext|>.
    An id list (Llama 3's generation_config.json has several) stops at any of them."""
    config_path = tokenizer_config_folder(folder) / TOKENIZER_CONFIG
    eos_text = token_text(read_optional_json(config_path).get("eos_token"))
    if eos_text:
        token_id = tokenizer.token_to_id(eos_text)
        if token_id is None:
            raise InputError(f"{config_path}: eos_token {eos_text!r} is not in the tokenizer")
        return [token_id], f"{eos_text} (eos_token of {TOKENIZER_CONFIG})"
    for name in (GENERATION_CONFIG, CONFIG_JSON):
        ids = read_optional_json(folder / name).get("eos_token_id")
        if ids is not None:
            ids = [ids] if isinstance(ids, int) else list(ids)
            if not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
                raise InputError(f"{folder / name}: eos_token_id {ids} is not a token id below {vocab_size}")
            return ids, f"{' or '.join(str(tokenizer.id_to_token(i)) for i in ids)} (eos_token_id of {name})"
    token_id = tokenizer.token_to_id("<|endoftext|>")
    return ([], "none") if token_id is None else ([token_id], "<|endoftext|> (in the vocabulary)")


def token_text(token) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""
