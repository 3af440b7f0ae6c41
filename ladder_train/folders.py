"""What a folder is, by its files: the one owner of folder kinds (export, checkpoint, token folder), the file names
that decide them, a run's complete checkpoints (its ``step-N`` folders with the marker) and the run a checkpoint belongs
to, and a folder's optional JSON files. Reads file names and small JSON files only; never weights, never code. How a
file in such a folder is checked before it is opened, and written, is ``files.py``'s; the folder lock
``folder_lock.py``'s."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .errors import InputError
from .files import is_plain_file, refuse_link

CONFIG_JSON = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"  # a sharded folder: weight_map of tensor name -> shard file
COMPLETE_MARKER = "COMPLETE"  # written last into a checkpoint folder: without it the checkpoint is incomplete
DCP_METADATA = ".metadata"
TOKEN_FOLDER_META = "ladder_tokens.json"  # written last by ladder-data prepare
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
FOLDER_KINDS = ("export", "checkpoint", "incomplete checkpoint")
_STEP_DIR = re.compile(r"^step-(\d+)$")  # a training checkpoint of step N in RUN_DIR/checkpoints/
CHECKPOINT_KINDS = ("checkpoint", "incomplete checkpoint")


def folder_kind(path: str | Path) -> str | None:
    """What a model folder is, by its files alone (nothing is read): ``"export"`` (a Hugging Face Llama folder:
    config.json + model.safetensors or its shard index, what ladder-export writes or a pretrained Llama),
    ``"checkpoint"`` (a complete training checkpoint: the COMPLETE marker), ``"incomplete checkpoint"`` (DCP files
    without the marker), or None."""
    path = Path(path)
    if is_plain_file(path / CONFIG_JSON) and (is_plain_file(path / WEIGHTS_FILE) or is_plain_file(path / INDEX_FILE)):
        return "export"
    if is_plain_file(path / COMPLETE_MARKER):
        return "checkpoint"
    if is_plain_file(path / DCP_METADATA):
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


def step_number(path: str | Path) -> int | None:
    """N of a ``step-N`` folder, else None."""
    match = _STEP_DIR.match(Path(path).name)
    return int(match.group(1)) if match else None


def complete_checkpoints(folder: Path, warn: bool = False) -> list[Path]:
    """The complete ``step-N`` checkpoints in ``folder`` (a run's checkpoints/), oldest first; ``warn``: name each
    incomplete one on stderr."""
    found = []
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        step = step_number(path)
        if step is None or not path.is_dir():
            continue
        if (path / COMPLETE_MARKER).is_file():
            found.append((step, path))
        elif warn:
            print(f"warning: skipping incomplete checkpoint {path} (no {COMPLETE_MARKER} marker)", file=sys.stderr)
    return [path for _, path in sorted(found)]


def run_config_path(checkpoint: str | Path) -> Path:
    """The config of the run a training checkpoint belongs to: ``RUN_DIR/config.yaml`` for
    ``RUN_DIR/checkpoints/step-N`` (it may not exist, e.g. for a copied checkpoint)."""
    return Path(checkpoint).resolve().parent.parent / "config.yaml"


def read_optional_json(path: Path) -> dict:
    """A folder's optional JSON file: {} when absent; InputError (one line) when unreadable or no regular file."""
    if not is_plain_file(path):
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from None


def refuse_step_links(folder: Path, what: str) -> None:
    """InputError naming a link at ``folder`` or at a ``step-N`` in it (a run's exports: never written through a
    link), checked before a run starts."""
    refuse_link(folder, f"{what} folder")
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if step_number(path) is not None:
                refuse_link(path, what)
