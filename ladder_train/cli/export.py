"""``ladder-export CHECKPOINT OUT_DIR [--dtype bf16]``: a training checkpoint to ``model.safetensors`` +
``config.json`` (Hugging Face Llama names; see model/hf_format.py), plus the run's ``tokenizer.json``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoint.export import export_checkpoint
from ..dtypes import DTYPES


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ladder-export", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="RUN_DIR/checkpoints/step-N")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args(argv)
    out = export_checkpoint(args.checkpoint, args.out_dir, DTYPES[args.dtype])
    print(f"exported {args.checkpoint} to {out} ({args.dtype})")
    return 0
