"""``ladder-export CHECKPOINT OUT_DIR [--dtype bf16]``: a training checkpoint to ``model.safetensors`` +
``config.json`` (Hugging Face Llama names; see model/hf_format.py), plus the run's ``tokenizer.json``."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

from .config import ConfigError, load_config
from .loading import model_from_checkpoint
from .model.hf_format import save_export

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def export_checkpoint(checkpoint: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> Path:
    model = model_from_checkpoint(checkpoint)
    save_export(model, out_dir, dtype)
    # the run's config sits at RUN_DIR/config.yaml, two levels above RUN_DIR/checkpoints/step-N
    run_config = checkpoint.resolve().parent.parent / "config.yaml"
    if run_config.is_file():
        from .data import load_tokenizer

        cfg = load_config(run_config)
        try:
            load_tokenizer(cfg.data.tokenizer).save(str(out_dir / "tokenizer.json"))
        except ConfigError as err:  # e.g. a hub tokenizer on an offline machine: the weights still export
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
    from .data.chat import TOKENIZER_CONFIG, run_tokenizer_config_folder

    folder = run_tokenizer_config_folder(cfg.data)
    if folder is not None:
        shutil.copyfile(folder / TOKENIZER_CONFIG, out_dir / TOKENIZER_CONFIG)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ladder-export", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="RUN_DIR/checkpoints/step-N")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args(argv)
    out = export_checkpoint(args.checkpoint, args.out_dir, DTYPES[args.dtype])
    print(f"exported {args.checkpoint} to {out} ({args.dtype})")
    return 0


if __name__ == "__main__":
    from .cli import export

    sys.exit(export())
