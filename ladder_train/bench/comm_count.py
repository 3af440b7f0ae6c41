"""The all-reduces of one decode step, counted: the reduce calls a case's model makes on its communicator
(``bench_schema.FIELDS["all_reduces_per_decode_step"]``). Counted by ladder-bench, not stated by the model: a
desync layout's skipped all-reduces show here as calls that never happen."""

from __future__ import annotations

import torch

from ..inference import Generator
from ..model import Communicator, Transformer


class CountingCommunicator(Communicator):
    """``inner`` with its ``reduce`` calls counted (``calls``); ``wait`` and ``fence`` pass through. Eager only: a
    compiled step would run the count once, at tracing."""

    def __init__(self, inner: Communicator):
        self.inner = inner
        self.tp_degree = inner.tp_degree
        self.calls = 0

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner.reduce(x)

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.wait(x)

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.inner.fence(*tensors)


def all_reduces_per_decode_step(model: Transformer, comm: Communicator | None, group) -> int:
    """The reduce calls of one decode step of ``model`` on ``comm`` (None: TP 1, no communicator, 0): an eager
    generation of two tokens after a one-token prompt, the calls after its prefill counted, on every rank of
    ``group`` at once (the all-reduces are real). Run before the case's own Generator allocates its cache: this
    one's is freed after."""
    if comm is None:
        return 0
    counter = CountingCommunicator(comm)
    model.set_communicator(counter)
    marks = {}
    try:
        prompt = torch.zeros(1, 1, dtype=torch.long, device=model.tok_embeddings.weight.device)
        Generator(model, group).generate(prompt, 2, on_prefill_done=lambda: marks.setdefault("prefill", counter.calls))
    finally:
        model.set_communicator(comm)
        model.clear_kv_cache()
    return counter.calls - marks["prefill"]
