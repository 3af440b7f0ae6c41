"""``ladder-export CHECKPOINT OUT_DIR [--dtype bf16]``: a training checkpoint to ``model.safetensors`` +
``config.json`` (Hugging Face Llama names; see model/hf_format.py), plus the run's ``tokenizer.json``."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.export import export_checkpoint
from ..dtypes import DTYPES
from ..errors import InputError
from .args import Parser, new_output_folder


def run(argv: list[str]) -> int:
    parser = Parser(prog="ladder-export", description=__doc__)
    parser.add_argument("checkpoint", type=Path, help="RUN_DIR/checkpoints/step-N")
    parser.add_argument("out_dir", type=new_output_folder)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    args = parser.parse_args(argv)
    if not args.checkpoint.is_dir():  # a path the user typed: bad input, not a damaged checkpoint
        raise InputError(f"{args.checkpoint}: no such folder")
    source, target = args.checkpoint.resolve(), args.out_dir.resolve()
    if target == source or source in target.parents:
        parser.error(f"out_dir {args.out_dir} is inside the checkpoint {args.checkpoint}: write the export elsewhere")
    out = export_checkpoint(args.checkpoint, args.out_dir, DTYPES[args.dtype])
    print(f"exported {args.checkpoint} to {out} ({args.dtype})")
    return 0
