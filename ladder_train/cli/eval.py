"""``ladder-eval MODEL_DIR --tasks a,b``: evaluate a saved model with lm-eval, and/or its perplexity on held-out
text. Input is checked before the weights are loaded; bad input exits with one line on stderr."""

from __future__ import annotations

import json
from pathlib import Path

from ..evaluation.adapter import EvalError
from ..evaluation.task_registry import LOCAL_TASKS, PAPER_TASKS
from ..files import write_text
from .args import Parser, positive_int

DESCRIPTION = f"""Evaluate a Hugging Face Llama folder (an export written by ladder-export, or a pretrained Llama) on
lm-eval tasks and/or held-out perplexity, or a training checkpoint (RUN_DIR/checkpoints/step-N, read directly,
with the run's tokenizer). Tasks: lm-eval built-in names (data downloaded from the Hub; default: the paper's
{",".join(PAPER_TASKS)}), your own YAMLs (--include-path), or the offline tasks {", ".join(LOCAL_TASKS)}
over local copies (--local-data DIR, the layout of ../shared/eval)."""


def _parser() -> Parser:
    parser = Parser(prog="ladder-eval", description=DESCRIPTION)
    parser.add_argument(
        "model_dir", help="a Hugging Face Llama folder (config.json + safetensors) or a training checkpoint"
    )
    parser.add_argument("--tasks", help="comma-separated task names (default: the paper's, unless --val-data alone)")
    parser.add_argument("--include-path", help="a folder of your own lm-eval task YAMLs (read offline)")
    parser.add_argument("--local-data", help="a folder with local eval sets for the *_local tasks")
    parser.add_argument("--limit", type=positive_int, help="rows per task (quick checks); default: all")
    parser.add_argument("--tokenizer", help="tokenizer.json path or hub name (default: MODEL_DIR/tokenizer.json)")
    parser.add_argument(
        "--out", help="results JSON (default: MODEL_DIR/eval/results.json; RUN_DIR/eval/step-N.json for a checkpoint)"
    )
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument("--max-length", type=positive_int, help="context length for scoring (default: the model's)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument(
        "--val-data", help="held-out text (parquet/jsonl/txt file or folder): report loss and perplexity"
    )
    parser.add_argument("--val-seq-len", type=positive_int, default=2048, help="tokens per validation window")
    parser.add_argument(
        "--val-batches", type=positive_int, default=20, help="validation batches (of --batch-size windows)"
    )
    return parser


def _device(name: str | None):
    """--device as a torch.device, refused in one line when this machine has no such device."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise EvalError(f"--device {name!r}: not a device name (cpu, cuda, cuda:1 ...)") from None
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise EvalError(f"--device {name}: no such CUDA device on this machine ({torch.cuda.device_count()} visible)")
    if device.type not in ("cpu", "cuda"):
        raise EvalError(f"--device {name}: ladder-eval runs on cpu or cuda")
    return device


def run(argv: list[str]) -> int:

    from ..evaluation.harness import evaluate
    from ..evaluation.perplexity import held_out_batches, held_out_files, perplexity, validation_loss
    from ..evaluation.saved_model import open_saved_model

    args = _parser().parse_args(argv)
    if args.val_data:
        held_out_files(args.val_data)  # bad held-out data is one line before the model is opened
    saved = open_saved_model(args.model_dir, args.tokenizer)
    if args.tasks is not None:
        tasks = [t for t in args.tasks.split(",") if t.strip()]
    else:
        tasks = [] if args.val_data else list(PAPER_TASKS)
    device = _device(args.device)
    model = saved.load(device)
    out = Path(args.out) if args.out else saved.default_results_path()
    if tasks:
        evaluate(
            model,
            saved.tokenizer,
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
        batches = held_out_batches(args.val_data, saved.tokenizer, seq_len, args.batch_size, args.val_batches)
        loss, n_tokens = validation_loss(model, batches)
        print(f"held-out {args.val_data}: loss {loss:.4f}, perplexity {perplexity(loss):.2f} over {n_tokens} tokens")
        held_out = {
            "data": str(args.val_data),
            "seq_len": seq_len,
            "tokens": n_tokens,
            "loss": loss,
            "perplexity": perplexity(loss),
        }
        record = json.loads(out.read_text()) if tasks else {}  # this invocation's task results, if any
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, json.dumps({**record, "held_out": held_out}, indent=2) + "\n")
        print(f"held-out result written to {out}")
    return 0
