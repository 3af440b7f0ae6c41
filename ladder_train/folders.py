"""What a folder is, by its files: the one owner of folder kinds (export, checkpoint, token folder), the file names
that decide them, the run a checkpoint belongs to, and a folder's optional JSON files. Reads file names and small
JSON files only; never weights, never code."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError
from .model import INDEX_FILE, WEIGHTS_FILE

CONFIG_JSON = "config.json"
COMPLETE_MARKER = "COMPLETE"  # written last into a checkpoint folder: without it the checkpoint is incomplete
DCP_METADATA = ".metadata"
TOKEN_FOLDER_META = "ladder_tokens.json"  # written last by ladder-data prepare
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
FOLDER_KINDS = ("export", "checkpoint", "incomplete checkpoint")
CHECKPOINT_KINDS = ("checkpoint", "incomplete checkpoint")


def folder_kind(path: str | Path) -> str | None:
    """What a model folder is, by its files alone (nothing is read): ``"export"`` (a Hugging Face Llama folder:
    config.json + model.safetensors or its shard index, what ladder-export writes or a pretrained Llama),
    ``"checkpoint"`` (a complete training checkpoint: the COMPLETE marker), ``"incomplete checkpoint"`` (DCP files
    without the marker), or None."""
    path = Path(path)
    if (path / CONFIG_JSON).is_file() and ((path / WEIGHTS_FILE).is_file() or (path / INDEX_FILE).is_file()):
        return "export"
    if (path / COMPLETE_MARKER).is_file():
        return "checkpoint"
    if (path / DCP_METADATA).is_file():
        return "incomplete checkpoint"
    return None


def is_token_folder(source) -> bool:
    """Whether ``source`` is a token folder (``ladder-data prepare``'s output): it holds the metadata file."""
    return source is not None and Path(str(source)).expanduser().joinpath(TOKEN_FOLDER_META).is_file()


def token_folder_of(path) -> Path | None:
    """The token folder ``path`` is a file of (``FOLDER/tokens.bin`` given where ``FOLDER`` is meant), else None."""
    path = Path(str(path)).expanduser()
    return path.parent if path.is_file() and is_token_folder(path.parent) else None


def recorded_max_token_id(folder) -> int | None:
    """The largest token id a token folder's metadata records (ladder-data prepare writes it); None when it
    records none (a folder made before it was recorded) or is no token folder. Not checked against the tokens."""
    meta = read_optional_json(Path(str(folder)).expanduser() / TOKEN_FOLDER_META)
    value = meta.get("max_token_id") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def run_config_path(checkpoint: str | Path) -> Path:
    """The config of the run a training checkpoint belongs to: ``RUN_DIR/config.yaml`` for
    ``RUN_DIR/checkpoints/step-N`` (it may not exist, e.g. for a copied checkpoint)."""
    return Path(checkpoint).resolve().parent.parent / "config.yaml"


def read_optional_json(path: Path) -> dict:
    """A folder's optional JSON file: {} when absent; InputError (one line) when unreadable."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from None


def token_text(token) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""
