"""One prompt, one completion with a saved model, at TP 1 or as one rank of a tensor-parallel group: what
``ladder-generate`` runs (its flags and printing: ``cli/generate.py``). Every check of the input happens before any
weight is read; each rank loads only its shard."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .data import load_chat_template, model_tokenizer, stop_tokens, tokenizer_config_folder
from .errors import InputError
from .inference import Generator, check_tp_degree, load_tp_model
from .loading import ModelSource, resolve_source
from .parallel import init_distributed, resolve_dtype


@dataclass(frozen=True)
class CompletionRequest:
    model: str | Path  # an export or Hugging Face Llama folder, or RUN_DIR/checkpoints/step-N
    prompt: str
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int | None = None  # with temperature > 0: sample among the k most likely tokens
    seed: int = 0
    chat: bool = False  # wrap the prompt as one user message in the model's chat template
    tokenizer: str | None = None  # default: the model's own (data.model_tokenizer)
    dtype: str | None = None  # default: bf16 on a GPU, fp32 on the CPU


@dataclass(frozen=True)
class Completion:
    text: str  # the new text, up to (not including) the stop token
    new_tokens: int
    seconds: float
    stop_name: str | None  # the stop token it ended at; None when max_new_tokens was reached
    rank: int
    tp: int


@dataclass(frozen=True)
class Prepared:
    source: ModelSource
    tokenizer: object
    prompt: list[int]
    stop: list[int]
    stop_name: str


def encode_prompt(request: CompletionRequest, source: ModelSource, tokenizer) -> list[int]:
    """The prompt's token ids, checked against the model's context before anything is loaded."""
    text = request.prompt
    if request.chat:
        template = load_chat_template(tokenizer_config_folder(source.path))
        text = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    # a template writes its own special tokens (bos included) as text; a plain prompt gets the tokenizer's own
    # (e.g. a Llama's leading bos), as transformers does
    ids = tokenizer.encode(text, add_special_tokens=not request.chat).ids
    max_len = source.args.max_seq_len
    if not ids:
        raise InputError("the prompt is empty: there is nothing to complete")
    if len(ids) >= max_len:
        raise InputError(
            f"the prompt is {len(ids)} tokens, the model's max_seq_len is {max_len}: no room for a new token"
        )
    if len(ids) + request.max_new_tokens > max_len:
        raise InputError(
            f"the prompt ({len(ids)} tokens) + max_new_tokens={request.max_new_tokens} exceed the model's "
            f"max_seq_len={max_len}: at most {max_len - len(ids)} new tokens fit"
        )
    return ids


def prepare(request: CompletionRequest, world: int) -> Prepared:
    """Every check that needs the model's folder, before any weights are read: the source, its tokenizer and stop
    tokens, the chat template, the prompt's length and the TP degree. Raises InputError (one line)."""
    source = resolve_source(request.model)
    if source.kind == "preset":
        raise InputError(
            f"{request.model!r} is a preset (random weights, no tokenizer): give a model folder or checkpoint"
        )
    check_tp_degree(source.args, world, str(request.model))
    tokenizer, _ = model_tokenizer(source.path, request.tokenizer)
    if tokenizer.get_vocab_size() > source.args.vocab_size:
        raise InputError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens but {request.model} only "
            f"vocab_size={source.args.vocab_size}: not the tokenizer it was trained with"
        )
    stop, stop_name = stop_tokens(source.path, tokenizer, source.args.vocab_size)
    return Prepared(source, tokenizer, encode_prompt(request, source, tokenizer), stop, stop_name)


def completion_text(tokenizer, prompt: list[int], new: list[int], stop: list[int]) -> str:
    """The new tokens as text, up to (not including) the first stop token. Decoded together with the prompt and
    cut after it, because some decoders render a token differently at the start of a text (a leading space)."""
    cut = next((i for i, token in enumerate(new) if token in stop), len(new))
    head = tokenizer.decode(prompt, skip_special_tokens=False)
    full = tokenizer.decode(prompt + new[:cut], skip_special_tokens=False)
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(new[:cut], skip_special_tokens=False)


def complete(request: CompletionRequest) -> Completion:
    """One completion of ``request.prompt``; under torchrun, this rank's part of it (every rank returns the same
    text; the caller prints rank 0's)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        ready = prepare(request, world)
    except InputError as err:
        err.quiet = rank != 0  # every rank found the same bad input: one line, from rank 0
        raise
    env = init_distributed(group_of_one=False)
    dtype = resolve_dtype(request.dtype or "auto", env.device)
    group = dist.group.WORLD if world > 1 else None
    try:
        model = load_tp_model(ready.source.path, rank, world, env.device, dtype, group=group)
        start = time.perf_counter()
        prompt = torch.tensor([ready.prompt], device=env.device)
        generator = Generator(model, group)
        tokens = generator.generate(
            prompt, request.max_new_tokens, request.temperature, request.top_k, request.seed, stop_tokens=ready.stop
        )
        new = tokens[0].tolist()
        seconds = time.perf_counter() - start
    finally:
        if group is not None:
            dist.destroy_process_group()
    text = completion_text(ready.tokenizer, ready.prompt, new, ready.stop)
    stopped = ready.stop_name if new[-1] in ready.stop else None
    return Completion(text, len(new), seconds, stopped, rank, world)
