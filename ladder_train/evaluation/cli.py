"""``ladder-eval EXPORT_DIR --tasks a,b``: evaluate an exported model with lm-eval, and/or its perplexity on
held-out text. Input is checked before the weights are loaded; bad input exits with one line on stderr."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ..data.tokenizer import eos_id
from .adapter import EvalError
from .task_registry import LOCAL_TASKS, PAPER_TASKS

DESCRIPTION = f"""Evaluate a Hugging Face Llama folder (an export written by ladder-export, or a pretrained Llama) on
lm-eval tasks and/or held-out perplexity, or a training checkpoint (RUN_DIR/checkpoints/step-N, exported on
the fly with the run's tokenizer). Tasks: lm-eval built-in names (data downloaded from the Hub; default: the paper's
{",".join(PAPER_TASKS)}), your own YAMLs (--include-path), or the offline tasks {", ".join(LOCAL_TASKS)}
over local copies (--local-data DIR, the layout of ../shared/eval)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ladder-eval", description=DESCRIPTION)
    parser.add_argument(
        "model_dir", help="a Hugging Face Llama folder (config.json + safetensors) or a training checkpoint"
    )
    parser.add_argument("--tasks", help="comma-separated task names (default: the paper's, unless --val-data alone)")
    parser.add_argument("--include-path", help="a folder of your own lm-eval task YAMLs (read offline)")
    parser.add_argument("--local-data", help="a folder with local eval sets for the *_local tasks")
    parser.add_argument("--limit", type=int, help="rows per task (quick checks); default: all")
    parser.add_argument("--tokenizer", help="tokenizer.json path or hub name (default: MODEL_DIR/tokenizer.json)")
    parser.add_argument("--out", help="results JSON (default: MODEL_DIR/eval/results.json)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, help="context length for scoring (default: the model's)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument(
        "--val-data", help="held-out text (parquet/jsonl/txt file or folder): report loss and perplexity"
    )
    parser.add_argument("--val-seq-len", type=int, default=2048, help="tokens per validation window")
    parser.add_argument("--val-batches", type=int, default=20, help="validation batches (of --batch-size windows)")
    return parser


def _read_export_config(model_dir: Path) -> dict:
    from ..model.hf_format import INDEX_FILE, WEIGHTS_FILE

    if not (model_dir / "config.json").is_file():
        raise EvalError(f"{model_dir}: not a model folder (missing config.json) nor a complete training checkpoint")
    if not ((model_dir / WEIGHTS_FILE).is_file() or (model_dir / INDEX_FILE).is_file()):
        raise EvalError(f"{model_dir}: not a model folder (missing {WEIGHTS_FILE} or {INDEX_FILE})")
    return json.loads((model_dir / "config.json").read_text())


def _check_tokenizer(config: dict, tokenizer, config_path: Path, tokenizer_name: str) -> None:
    """The model must have been trained with this tokenizer: same vocabulary size, same end-of-text id."""
    vocab = tokenizer.get_vocab_size()
    if config.get("vocab_size") != vocab:
        raise EvalError(
            f"tokenizer mismatch: {config_path} has vocab_size {config.get('vocab_size')} but tokenizer {tokenizer_name} has {vocab}"
        )
    eot_id = eos_id(tokenizer, where=tokenizer_name)
    # ladder-train's own exports separate documents with <|endoftext|>; a pretrained model's eos may differ
    # (SmolLM2-Instruct's is <|im_end|>), and scoring only needs <|endoftext|> to exist
    if "residual" in config and config.get("eos_token_id") is not None and config["eos_token_id"] != eot_id:
        raise EvalError(
            f"tokenizer mismatch: {config_path} has eos_token_id {config['eos_token_id']} but the document separator is {eot_id} in tokenizer {tokenizer_name}"
        )


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from ..checkpoint import COMPLETE_MARKER

    checkpoint = Path(args.model_dir)
    if not (checkpoint / COMPLETE_MARKER).is_file():
        return _run_export(args)
    from ..export import export_checkpoint

    with tempfile.TemporaryDirectory(prefix="ladder-eval-export-") as tmp:
        export_checkpoint(checkpoint, Path(tmp))
        args.model_dir = tmp
        # results beside the run's other evaluations: RUN_DIR/eval/step-N.json
        args.out = args.out or str(checkpoint.resolve().parent.parent / "eval" / f"{checkpoint.name}.json")
        return _run_export(args)


def _run_export(args: argparse.Namespace) -> int:
    import torch

    from ..data.tokenizer import model_tokenizer
    from ..loading import load_model
    from .perplexity import held_out_batches, perplexity, validation_loss
    from .run import evaluate

    model_dir = Path(args.model_dir)
    config = _read_export_config(model_dir)
    tokenizer, tokenizer_name = model_tokenizer(model_dir, args.tokenizer)
    _check_tokenizer(config, tokenizer, model_dir / "config.json", tokenizer_name)
    if args.tasks is not None:
        tasks = [t for t in args.tasks.split(",") if t.strip()]
    else:
        tasks = [] if args.val_data else list(PAPER_TASKS)
    if args.val_data and not Path(args.val_data).exists():
        raise EvalError(f"--val-data {args.val_data} does not exist")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_model(model_dir, device=device)
    out = Path(args.out) if args.out else model_dir / "eval" / "results.json"

    if tasks:
        evaluate(
            model,
            tokenizer,
            tasks,
            include_path=args.include_path,
            limit=args.limit,
            batch_size=args.batch_size,
            out_path=out,
            local_data=args.local_data,
            max_length=args.max_length,
            device=device,
        )
        print(f"results written to {out}")
    if args.val_data:
        seq_len = min(args.val_seq_len, model.args.max_seq_len)
        batches = held_out_batches(args.val_data, tokenizer, seq_len, args.batch_size, args.val_batches)
        loss, n_tokens = validation_loss(model, batches)
        print(f"held-out {args.val_data}: loss {loss:.4f}, perplexity {perplexity(loss):.2f} over {n_tokens} tokens")
    return 0


if __name__ == "__main__":
    from ..cli import evaluate

    sys.exit(evaluate())
