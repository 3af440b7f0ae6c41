"""Generation with a static KV cache: prefill the prompt, then one-token decode steps.

Works the same with or without tensor parallelism: under TP each rank holds the cache of its own heads
and computes the full logits, which the all-reduces make identical on every rank, so greedy decoding
needs no further communication. Random sampling broadcasts rank 0's tokens (ranks may hold different
generator states); the ``none`` ceiling's logits differ per rank, which does not matter for its timing.

``compile=True`` compiles the prefill and the decode step with ``fullgraph=True`` and ``dynamic=False``
(on a GPU with ``mode="reduce-overhead"``: CUDA graphs). The decode step passes the position as a 0-d
tensor, which selects the model's static-shape path (the whole cache, masked), so one graph serves every
step; the prefill has one graph per prompt shape. As in gpt-fast, nothing in a step waits for or copies from
the host: the position is made on the device once per generation and advanced in place, the next token is chosen
inside the step's graph (the argmax, or a top-k sample by the exponential race whose Exp(1) draws a seeded
generator writes into a fixed buffer before the step, so eager and compiled sample the same tokens), and the KV cache is allocated once per (batch, length) and zeroed in place
(a CUDA graph keeps its inputs' addresses: a new cache would be recorded again). Each Generator's graphs are specialised to its model and
communicator (dynamo guards on them): the benchmark raises dynamo's recompile limit to its number of
(model, communicator, batch size) cases and counts the compilations.

The end of this file completes one prompt with a saved model: what ``ladder-generate`` runs (its flags:
``cli/generate.py``; ``python -m ladder_train.inference`` is the command, what torchrun launches with ``-m``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..dtypes import resolve_dtype
from ..errors import InputError
from ..model import Transformer
from ..model.tp_sharding import check_tp_degree


def choose(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, noise=None) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, vocab), with no host sync, so it runs inside a compiled step:
    greedy at temperature 0, else a top-k sample by the exponential race argmax(p / E), E ~ Exp(1) given as
    ``noise`` (B, vocab) (drawn outside the step: a seeded torch.Generator cannot enter the graph)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # a zero draw would make a masked token's 0 / 0 a NaN that argmax picks
    return (torch.softmax(logits, dim=-1) / noise.clamp_min(torch.finfo(noise.dtype).tiny)).argmax(dim=-1)


def draw_noise(shape: tuple[int, int], generator: torch.Generator, device, out: torch.Tensor | None = None):
    """Exp(1) draws for ``choose`` from a seeded generator, in place into ``out`` when given (a fixed buffer)."""
    out = torch.empty(shape, dtype=torch.float32, device=device) if out is None else out
    return out.exponential_(generator=generator)


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, generator=None) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, vocab): greedy at temperature 0, else top-k sampling."""
    if temperature <= 0:
        return choose(logits)
    generator = generator or torch.Generator(device=logits.device)
    return choose(logits, temperature, top_k, draw_noise(tuple(logits.shape), generator, logits.device))


def inductor_options(device: torch.device) -> dict:
    """Inductor's settings for the generation steps.

    By default inductor schedules each ``wait_tensor`` right after its all-reduce, which would make the
    ladder's asynchronous all-reduces blocking inside the compiled graph; the ``sink_waits`` pass moves
    every wait to just before the first use of its result, where the model's code waits, and
    ``raise_comms`` issues every all-reduce as soon as its input exists. CUDA graphs
    (what ``mode="reduce-overhead"`` turns on, which cannot be combined with ``options``) on a GPU only."""
    return {
        "triton.cudagraphs": device.type == "cuda",
        "reorder_for_compute_comm_overlap": True,
        "reorder_for_compute_comm_overlap_passes": ["sink_waits", "raise_comms"],
    }


class Generator:
    """Holds a (possibly sharded) model and its KV cache; ``generate`` returns the new tokens (B, n)."""

    def __init__(
        self,
        model: Transformer,
        tp_group: dist.ProcessGroup | None = None,
        compile: bool = False,
        backend: str = "inductor",
    ):
        self.model = model
        self.tp_group = tp_group
        self.compiled = compile
        self.device = model.tok_embeddings.weight.device
        self._prefill, self._decode = self._prefill_eager, self._decode_eager
        if compile:
            options = inductor_options(self.device) if backend == "inductor" else None
            settings = dict(fullgraph=True, dynamic=False, backend=backend, options=options)
            self._prefill = torch.compile(self._prefill_eager, **settings)
            self._decode = torch.compile(self._decode_eager, **settings)
        self.cache_shape: tuple[int, int] | None = None
        self._caches: list = []  # the model's KVCache modules this Generator allocated
        self._written = False  # a generation has written to them since they were last zeroed
        self._noise: torch.Tensor | None = None  # the sampling draws' fixed buffer (B, vocab)

    def setup(self, batch: int, max_len: int):
        """Allocate the cache once per (batch, max_len) and zero it in place afterwards: the same tensors, whose
        addresses a CUDA graph keeps (new ones would make it record again). Zeroing only after a generation wrote
        to it, so the benchmark can zero outside its timed region by calling this first."""
        if self.cache_shape != (batch, max_len) or self.model.kv_caches() != self._caches:
            self.model.setup_kv_cache(batch, max_len)
            self.cache_shape, self._caches = (batch, max_len), self.model.kv_caches()
        elif self._written:
            self.model.zero_kv_cache()
        self._written = False

    def release(self):
        """Free the cache (the benchmark, moving on to another batch size)."""
        self.model.clear_kv_cache()
        self.cache_shape, self._caches = None, []

    def _prefill_eager(self, prompt: torch.Tensor, how: tuple | None = None, noise=None) -> torch.Tensor:
        """Logits after ``prompt``, or with ``how`` = (temperature, top_k) the next tokens, chosen in the same graph."""
        logits = self.model(prompt, start_pos=0, last_only=True)[:, -1]
        return logits if how is None else choose(logits, *how, noise)

    def _decode_eager(self, tokens: torch.Tensor, pos: int | torch.Tensor, how: tuple | None = None, noise=None):
        """Logits (or, with ``how``, the next tokens: argmax or sample in the same graph) after ``tokens`` (B, 1)."""
        logits = self.model(tokens, start_pos=pos, last_only=True)[:, -1]
        return logits if how is None else choose(logits, *how, noise)

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        # clone: a CUDA-graph output is overwritten by the next replay
        return self._prefill(prompt).clone() if self.compiled else self._prefill(prompt)

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits after feeding ``tokens`` (B,) at position ``pos`` (outside ``generate``: calibration, tests)."""
        if self.compiled:  # a tensor position keeps every step the same graph
            return self._decode(tokens[:, None], torch.tensor(pos, device=self.device)).clone()
        return self._decode(tokens[:, None], pos)

    def _next(self, step, inputs: tuple, temperature: float, top_k: int | None, generator) -> torch.Tensor:
        """The next tokens (B,) of a prefill or decode ``step``, chosen inside the step (compiled with it): the
        argmax, or a sample whose Exp(1) draws the seeded ``generator`` writes into one fixed buffer before the step
        (a kernel, no host sync). Tokens are cloned when compiled: they outlive the graph's output."""
        noise = None
        if temperature > 0:
            shape = (inputs[0].shape[0], self.model.args.vocab_size)
            if self._noise is None or self._noise.shape != shape:
                self._noise = torch.empty(shape, dtype=torch.float32, device=self.device)
                torch._dynamo.mark_static_address(self._noise)  # CUDA graphs read it in place, no copy per step
            noise = draw_noise(shape, generator, self.device, out=self._noise)
        tokens = step(*inputs, how=(temperature, top_k), noise=noise)
        tokens = tokens.clone() if self.compiled else tokens
        return self.agree(tokens) if temperature > 0 else tokens

    def agree(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every TP rank continues with rank 0's tokens."""
        if self.tp_group is not None and dist.get_world_size(self.tp_group) > 1:
            dist.broadcast(tokens, src=dist.get_global_rank(self.tp_group, 0), group=self.tp_group)
        return tokens

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        seed: int = 0,
        on_prefill_done=None,
        stop_tokens: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Greedy or top-k/temperature generation of ``max_new_tokens`` after ``prompt`` (B, T).
        ``on_prefill_done`` (optional) is called once the first token exists, for timing.

        ``stop_tokens`` (default none: always ``max_new_tokens``, as the benchmark needs): a row is finished once
        it has produced one of these ids, and repeats it from then on; generation ends when every row is
        finished, so the result can be shorter than ``max_new_tokens``."""
        batch, prompt_len = prompt.shape
        total = prompt_len + max_new_tokens
        if total > self.model.args.max_seq_len:
            raise ValueError(
                f"prompt {prompt_len} + {max_new_tokens} new tokens exceed max_seq_len={self.model.args.max_seq_len}"
            )
        self.setup(batch, total)
        self._written = True
        # greedy tokens are equal on every rank already (replicated logits): only samples are broadcast (agree)
        generator = torch.Generator(device=self.device).manual_seed(seed) if temperature > 0 else None
        # compiled: the position lives on the device, made once and advanced in place (``+=`` is add_ on a
        # tensor), so no step copies it from the host; eager: a Python int (the sliced-cache path)
        pos = torch.full((), prompt_len, dtype=torch.long, device=self.device) if self.compiled else prompt_len
        tokens = self._next(self._prefill, (prompt,), temperature, top_k, generator)
        if on_prefill_done is not None:
            on_prefill_done()
        out = [tokens]
        stop = torch.tensor(list(stop_tokens), device=self.device) if stop_tokens else None
        finished = torch.isin(tokens, stop) if stop is not None else None
        for _ in range(max_new_tokens - 1):
            # ladder-generate's stop check waits for the GPU each step (bool); the benchmark passes no stop_tokens.
            # Every rank holds the same tokens (replicated logits or agree): every rank leaves at the same step
            if finished is not None and bool(finished.all()):
                break
            new = self._next(self._decode, (tokens[:, None], pos), temperature, top_k, generator)
            pos += 1
            if finished is not None:
                new = torch.where(finished, tokens, new)  # a finished row keeps repeating its stop token
                finished |= torch.isin(new, stop)
            tokens = new
            out.append(tokens)
        return torch.stack(out, dim=1)


# ``ladder-generate``: one prompt, one completion ------------------------------------------------------------


def read_optional_json(path):
    """A folder's optional JSON file: {} when absent."""
    import json

    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from None


def stop_tokens(folder, tokenizer, vocab_size: int) -> tuple[list[int], str]:
    """The end-of-sequence ids generation stops at and where they were found: the eos_token of
    tokenizer_config.json, else eos_token_id of generation_config.json, else of config.json, else <|endoftext|>.
    An id list (Llama 3's generation_config.json has several) stops at any of them."""
    from ..data.chat import TOKENIZER_CONFIG, _token_text, tokenizer_config_folder

    eos_text = _token_text(read_optional_json(tokenizer_config_folder(folder) / TOKENIZER_CONFIG).get("eos_token"))
    if eos_text:
        token_id = tokenizer.token_to_id(eos_text)
        if token_id is None:
            where = tokenizer_config_folder(folder) / TOKENIZER_CONFIG
            raise InputError(f"{where}: eos_token {eos_text!r} is not in the tokenizer")
        return [token_id], f"{eos_text} (eos_token of {TOKENIZER_CONFIG})"
    for name in ("generation_config.json", "config.json"):
        ids = read_optional_json(folder / name).get("eos_token_id")
        if ids is not None:
            ids = [ids] if isinstance(ids, int) else list(ids)
            if not all(isinstance(i, int) and 0 <= i < vocab_size for i in ids):
                raise InputError(f"{folder / name}: eos_token_id {ids} is not a token id below {vocab_size}")
            return ids, f"{' or '.join(str(tokenizer.id_to_token(i)) for i in ids)} (eos_token_id of {name})"
    token_id = tokenizer.token_to_id("<|endoftext|>")
    return ([], "none") if token_id is None else ([token_id], "<|endoftext|> (in the vocabulary)")


def encode_prompt(args, source, tokenizer) -> list[int]:
    """The prompt's token ids, checked against the model's context before anything is loaded."""
    text = args.prompt
    if args.chat:
        from ..data.chat import load_chat_template, tokenizer_config_folder

        template = load_chat_template(tokenizer_config_folder(source.path))
        text = template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    # a template writes its own special tokens (bos included) as text; a plain prompt gets the tokenizer's own
    # (e.g. a Llama's leading bos), as transformers does
    ids = tokenizer.encode(text, add_special_tokens=not args.chat).ids
    max_len = source.args.max_seq_len
    if not ids:
        raise InputError("--prompt is empty: there is nothing to complete")
    if len(ids) >= max_len:
        raise InputError(
            f"the prompt is {len(ids)} tokens, the model's max_seq_len is {max_len}: no room for a new token"
        )
    if len(ids) + args.max_new_tokens > max_len:
        raise InputError(
            f"the prompt ({len(ids)} tokens) + --max-new-tokens {args.max_new_tokens} exceed the model's "
            f"max_seq_len={max_len}: at most {max_len - len(ids)} new tokens fit"
        )
    return ids


def prepare(args, world: int):
    """Every check of the input, before any weights are read: the source, its tokenizer and stop tokens, the
    chat template, the prompt's length and the TP degree. Raises InputError (one line)."""
    from ..data.tokenizer import model_tokenizer
    from ..loading import resolve_source

    if args.max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise InputError(f"--temperature must be 0 (greedy) or positive, got {args.temperature}")
    if args.top_k is not None and (args.top_k < 1 or args.temperature == 0):
        raise InputError(f"--top-k {args.top_k}: needs --temperature > 0 and K >= 1 (it samples among K tokens)")
    source = resolve_source(args.model)
    if source.kind == "preset":
        raise InputError(
            f"{args.model!r} is a preset (random weights, no tokenizer): give a model folder or checkpoint"
        )
    check_tp_degree(source.args, world, args.model)
    tokenizer, _ = model_tokenizer(source.path, args.tokenizer)
    if tokenizer.get_vocab_size() > source.args.vocab_size:
        raise InputError(
            f"the tokenizer has {tokenizer.get_vocab_size()} tokens but {args.model} only "
            f"vocab_size={source.args.vocab_size}: not the tokenizer it was trained with"
        )
    stop, stop_name = stop_tokens(source.path, tokenizer, source.args.vocab_size)
    return source, tokenizer, encode_prompt(args, source, tokenizer), stop, stop_name


def completion_text(tokenizer, prompt: list[int], new: list[int], stop: list[int]) -> str:
    """The new tokens as text, up to (not including) the first stop token. Decoded together with the prompt and
    cut after it, because some decoders render a token differently at the start of a text (a leading space)."""
    cut = next((i for i, token in enumerate(new) if token in stop), len(new))
    head = tokenizer.decode(prompt, skip_special_tokens=False)
    full = tokenizer.decode(prompt + new[:cut], skip_special_tokens=False)
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(new[:cut], skip_special_tokens=False)


def complete(args) -> int:
    """One completion of ``args.prompt`` (``cli/generate.py``'s flags), printed by rank 0; one rank of it under
    torchrun, each loading only its shard."""
    import os
    import sys
    import time

    from ..loading import load_tp_model
    from ..parallel import init_distributed
    from .tp import TPCommunicator, comm_mode_for

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        source, tokenizer, prompt, stop, stop_name = prepare(args, world)
    except InputError as err:
        err.quiet = rank != 0  # every rank found the same bad input: one line, from rank 0
        raise
    env = init_distributed(group_of_one=False)
    dtype = resolve_dtype(args.dtype or "auto", env.device)
    group = dist.group.WORLD if world > 1 else None
    try:
        model = load_tp_model(source.path, rank, world, env.device, dtype, group=group)
        if group is not None:  # the ladder's all-reduces overlap the next module, as in the benchmark
            model.set_communicator(TPCommunicator(comm_mode_for(model.args.residual), group))
        start = time.perf_counter()
        new = Generator(model, group).generate(
            torch.tensor([prompt], device=env.device), args.max_new_tokens, args.temperature, args.top_k, args.seed,
            stop_tokens=stop,
        )[0].tolist()  # fmt: skip
        seconds = time.perf_counter() - start
    finally:
        if group is not None:
            dist.destroy_process_group()
    if rank == 0:
        print(completion_text(tokenizer, prompt, new, stop), flush=True)
        ended = f"stopped at {stop_name}" if new[-1] in stop else f"--max-new-tokens {args.max_new_tokens} reached"
        print(f"ladder-generate: {len(new)} new tokens in {seconds:.1f} s at TP {world}; {ended}", file=sys.stderr)
    return 0
