"""Generation with a static KV cache: prefill the prompt, then one-token decode steps.

Works the same with or without tensor parallelism: under TP each rank holds the cache of its own heads
and computes the full logits, which the all-reduces make identical on every rank, so greedy decoding
needs no further communication. Random sampling broadcasts rank 0's tokens (ranks may hold different
generator states); the ``none`` ceiling's logits differ per rank, which does not matter for its timing.

``compile=True`` compiles the prefill and the decode step with ``fullgraph=True`` and ``dynamic=False``
(on a GPU with ``mode="reduce-overhead"``: CUDA graphs). The decode step passes the position as a 0-d
tensor, which selects the model's static-shape path (the whole cache, masked), so one graph serves every
step; the prefill has one graph per prompt shape. Each Generator's graphs are specialised to its model and
communicator (dynamo guards on them): the benchmark raises dynamo's recompile limit to its number of
(model, communicator, batch size) cases and counts the compilations.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..model import Transformer


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None, generator=None) -> torch.Tensor:
    """Next tokens (B,) from last-position logits (B, vocab): greedy at temperature 0, else top-k sampling."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


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

    def setup(self, batch: int, max_len: int):
        """(Re)allocate the cache; a compiled step keeps its captured graph while the shape is unchanged."""
        if self.cache_shape != (batch, max_len):
            self.model.setup_kv_cache(batch, max_len)
            self.cache_shape = (batch, max_len)

    def release(self):
        """Free the cache (the benchmark measures several models in turn)."""
        self.model.clear_kv_cache()
        self.cache_shape = None

    def _prefill_eager(self, prompt: torch.Tensor) -> torch.Tensor:
        return self.model(prompt, start_pos=0, last_only=True)[:, -1]

    def _decode_eager(self, tokens: torch.Tensor, pos: int | torch.Tensor) -> torch.Tensor:
        return self.model(tokens, start_pos=pos, last_only=True)[:, -1]

    @torch.no_grad()
    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        # clone: a CUDA-graph output is overwritten by the next replay
        return self._prefill(prompt).clone() if self.compiled else self._prefill(prompt)

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits after feeding ``tokens`` (B,) at position ``pos``."""
        if self.compiled:  # a tensor position keeps every step the same graph
            return self._decode(tokens[:, None], torch.tensor(pos, device=self.device)).clone()
        return self._decode(tokens[:, None], pos)

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
    ) -> torch.Tensor:
        """Greedy or top-k/temperature generation of ``max_new_tokens`` after ``prompt`` (B, T).
        ``on_prefill_done`` (optional) is called once the first token exists, for timing."""
        batch, prompt_len = prompt.shape
        total = prompt_len + max_new_tokens
        if total > self.model.args.max_seq_len:
            raise ValueError(
                f"prompt {prompt_len} + {max_new_tokens} new tokens exceed max_seq_len={self.model.args.max_seq_len}"
            )
        self.setup(batch, total)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        # greedy tokens are equal on every rank already (replicated logits): broadcast only samples
        agree = self.agree if temperature > 0 else (lambda tokens: tokens)
        tokens = agree(sample(self.prefill(prompt), temperature, top_k, generator))
        if on_prefill_done is not None:
            on_prefill_done()
        out = [tokens]
        for pos in range(prompt_len, total - 1):
            tokens = agree(sample(self.decode_step(tokens, pos), temperature, top_k, generator))
            out.append(tokens)
        return torch.stack(out, dim=1)
