"""A training checkpoint to a Hugging Face Llama folder: ``model.safetensors`` + ``config.json`` (Hugging Face
Llama names; see model/hf_format.py), plus the run's ``tokenizer.json`` and chat template. ``ladder-export``
(cli/export.py) and the trainer's ``eval.mode=slurm`` call ``export_checkpoint``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from ..config import load_config
from ..loading import model_from_checkpoint, run_config_path
from ..model.hf_format import save_export


def export_checkpoint(checkpoint: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> Path:
    model = model_from_checkpoint(checkpoint)
    save_export(model, out_dir, dtype)
    run_config = run_config_path(checkpoint)
    if run_config.is_file():
        from ..data import DataError, load_tokenizer

        cfg = load_config(run_config)
        try:
            load_tokenizer(cfg.data.tokenizer).save(str(out_dir / "tokenizer.json"))
        except DataError as err:  # e.g. a hub tokenizer on an offline machine: the weights still export
            print(f"warning: the export has no tokenizer.json ({err})", file=sys.stderr)
        _copy_chat_template(cfg, out_dir)
    else:
        print(
            f"warning: {run_config} not found; the export has no tokenizer.json (pass --tokenizer to ladder-eval)",
            file=sys.stderr,
        )
    return out_dir


def _copy_chat_template(cfg, out_dir: Path) -> None:
    """A model adapted from a pretrained folder keeps its chat format: the tokenizer_config.json beside the run's
    tokenizer.json (or of data.chat_template) goes into the export, so ladder-generate --chat finds it."""
    from ..data.chat import TOKENIZER_CONFIG, run_tokenizer_config_folder

    folder = run_tokenizer_config_folder(cfg.data)
    if folder is not None:
        shutil.copyfile(folder / TOKENIZER_CONFIG, out_dir / TOKENIZER_CONFIG)
