"""``ladder-generate``: complete one prompt with a saved model (``ladder_train/completion.py``)."""

from __future__ import annotations

import math
import os
import sys

from ..errors import InputError
from ..parallel import DTYPES
from .args import Parser, positive_int, utf8_text

DESCRIPTION = """Complete one prompt with a saved model and print only the new text. MODEL is a Hugging Face Llama
folder or export (tokenizer: its tokenizer.json) or a training checkpoint RUN_DIR/checkpoints/step-N (tokenizer: the
run's data.tokenizer; tokenizer_config.json, with the chat template: the one beside the run's data.tokenizer or in
data.chat_template). Generation stops at the end-of-sequence token: the eos_token of tokenizer_config.json, else
eos_token_id of MODEL/generation_config.json, else of MODEL/config.json, else <|endoftext|>; or after
--max-new-tokens. Tensor parallel: torchrun --nproc-per-node N -m ladder_train.inference MODEL ...
(each rank loads only its shard; rank 0 prints)."""


def parser() -> Parser:
    p = Parser(prog="ladder-generate", description=DESCRIPTION)
    p.add_argument("model", help="a Hugging Face Llama folder, an export or RUN_DIR/checkpoints/step-N")
    p.add_argument("--prompt", required=True, type=utf8_text, help="the text to complete")
    p.add_argument("--max-new-tokens", type=int, default=64, help="at most this many new tokens (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default): greedy; above 0: sample")
    p.add_argument("--top-k", type=positive_int, help="with --temperature > 0: sample among the K most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="the sampling generator's seed (default 0)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as one user message in MODEL's chat template")
    p.add_argument("--tokenizer", help="tokenizer.json path or hub name (default: MODEL's, see above)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default: bf16 on a GPU, fp32 on the CPU")
    return p


def check_flags(args) -> None:
    """The flags' own ranges, before the model's folder is opened."""
    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise InputError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if args.top_k is not None and (args.top_k < 1 or args.temperature == 0):
        raise InputError(f"--top-k {args.top_k}: needs --temperature > 0 and K >= 1 (it samples among K tokens)")
    if not args.prompt and not args.chat:
        raise InputError("--prompt is empty: there is nothing to complete")


def run(argv: list[str]) -> int:
    """``ladder-generate``; one rank of it under torchrun (rank 0 prints)."""
    from ..completion import CompletionRequest, complete

    args = parser().parse_args(argv)
    try:
        check_flags(args)
    except InputError as err:
        err.quiet = os.environ.get("RANK", "0") != "0"  # every rank found the same bad flag: one line, from rank 0
        raise
    fields = ("model", "prompt", "max_new_tokens", "temperature", "top_k", "seed", "chat", "tokenizer", "dtype")
    done = complete(CompletionRequest(**{name: getattr(args, name) for name in fields}))
    if done.rank == 0:
        print(done.text, flush=True)
        ended = f"stopped at {done.stop_name}" if done.stop_name else f"--max-new-tokens {args.max_new_tokens} reached"
        print(
            f"ladder-generate: {done.new_tokens} new tokens in {done.seconds:.1f} s at TP {done.tp}; {ended}",
            file=sys.stderr,
        )
    return 0
