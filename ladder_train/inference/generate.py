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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from ..model import Transformer


class Sampling(NamedTuple):
    """How the next token is chosen: the argmax at temperature 0, else a sample among the ``top_k`` most likely."""

    temperature: float = 0.0
    top_k: int | None = None


def pick_next_tokens(
    logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, noise=None
) -> torch.Tensor:
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


def exponential_draws(shape: tuple[int, int], generator: torch.Generator, device, out: torch.Tensor | None = None):
    """Exp(1) draws for ``pick_next_tokens`` from a seeded generator, in place into ``out`` when given (a fixed buffer)."""
    out = torch.empty(shape, dtype=torch.float32, device=device) if out is None else out
    return out.exponential_(generator=generator)


def next_tokens(
    logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, generator=None
) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, vocab): greedy at temperature 0, else top-k sampling."""
    if temperature <= 0:
        return pick_next_tokens(logits)
    generator = generator or torch.Generator(device=logits.device)
    return pick_next_tokens(
        logits, temperature, top_k, exponential_draws(tuple(logits.shape), generator, logits.device)
    )


def inductor_options(device: torch.device, gemv_tuning: bool = False) -> dict:
    """Inductor's settings for the generation steps.

    By default inductor schedules each ``wait_tensor`` right after its all-reduce, which would make the
    ladder's asynchronous all-reduces blocking inside the compiled graph; the ``sink_waits`` pass moves
    every wait to just before the first use of its result, where the model's code waits, and
    ``raise_comms`` issues every all-reduce as soon as its input exists. CUDA graphs
    (what ``mode="reduce-overhead"`` turns on, which cannot be combined with ``options``) on a GPU only.

    ``gemv_tuning`` (the decode step, on a GPU): inductor's ``coordinate_descent_tuning``, under which it rewrites a
    matrix product with one row (batch-1 decode's every linear layer) as a Triton reduction fused with its
    neighbours and tunes its block sizes; without it that product is a cuBLAS call, which reads the weights far
    under the card's bandwidth (gpt-fast decodes with the same setting)."""
    return {
        "triton.cudagraphs": device.type == "cuda",
        "coordinate_descent_tuning": gemv_tuning and device.type == "cuda",
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
        gemv_tuning: bool = True,
    ):
        self.model = model
        self.tp_group = tp_group
        self.compiled = compile
        self.device = model.tok_embeddings.weight.device
        self._prefill, self._decode = self._prefill_eager, self._decode_eager
        if compile:
            model.fuse_projections()  # fewer kernels a decode step: one product for Q, K, V and one for gate, up
            inductor = backend == "inductor"
            settings = dict(fullgraph=True, dynamic=False, backend=backend)
            self._prefill = torch.compile(
                self._prefill_eager, **settings, options=inductor_options(self.device) if inductor else None
            )
            self._decode = torch.compile(
                self._decode_eager, **settings, options=inductor_options(self.device, gemv_tuning) if inductor else None
            )
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

    def _prefill_eager(self, prompt: torch.Tensor, sampling: Sampling | None = None, noise=None) -> torch.Tensor:
        """Logits after ``prompt``, or with ``sampling`` the next tokens, chosen in the same graph."""
        logits = self.model(prompt, start_pos=0, last_only=True)[:, -1]
        return logits if sampling is None else pick_next_tokens(logits, *sampling, noise)

    def _decode_eager(
        self, tokens: torch.Tensor, pos: int | torch.Tensor, sampling: Sampling | None = None, noise=None
    ):
        """Logits (or, with ``sampling``, the next tokens: argmax or sample in the same graph) after ``tokens`` (B, 1)."""
        logits = self.model(tokens, start_pos=pos, last_only=True)[:, -1]
        return logits if sampling is None else pick_next_tokens(logits, *sampling, noise)

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
            noise = exponential_draws(shape, generator, self.device, out=self._noise)
        tokens = step(*inputs, sampling=Sampling(temperature, top_k), noise=noise)
        tokens = tokens.clone() if self.compiled else tokens
        return self.share_rank0_tokens(tokens) if temperature > 0 else tokens

    def share_rank0_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
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
