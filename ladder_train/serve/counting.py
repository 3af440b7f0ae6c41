"""The all-reduces in flight while each module of the served model computes, counted inside vLLM's workers (run
through ``vllm.LLM.apply_model``): ``start_counting(model)`` before a generation, ``in_flight(model)`` after it.

Each reduce that returns before its sum is waited (the ladder's held all-reduce) is in flight until its wait; a
forward pre-hook on every attention and MLP notes how many are in flight as that module starts. Eager engines only
(``enforce_eager``): a compiled forward runs this Python once, while tracing."""

from __future__ import annotations

import torch
from torch import nn

from ..model import Communicator


class InFlightCounter(Communicator):
    """``inner`` with its pending all-reduces counted: a reduce whose result still needs a wait is in flight."""

    def __init__(self, inner: Communicator, log: list[int]):
        self.inner, self.tp_degree, self.log = inner, inner.tp_degree, log
        self.pending: set[int] = set()

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner.reduce(x)
        if getattr(self.inner, "mode", None) == "async":  # TPCommunicator's held all-reduce
            self.pending.add(id(out))
        return out

    def wait(self, x: torch.Tensor) -> torch.Tensor:
        self.pending.discard(id(x))
        return self.inner.wait(x)

    def fence(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.inner.fence(*tensors)


def start_counting(model: nn.Module) -> None:
    """Wrap each layer's communicator and note, as each attention and MLP starts, the all-reduces in flight."""
    log: list[int] = []
    counters: dict[int, InFlightCounter] = {}
    layers = model.model.layers
    for layer in layers:
        inner = layer.comm.inner if isinstance(layer.comm, InFlightCounter) else layer.comm
        counters.setdefault(id(inner), InFlightCounter(inner, log))
        layer.comm = counters[id(inner)]
    every = list(counters.values())

    def note(module, args):
        log.append(sum(len(c.pending) for c in every))

    model._in_flight_log = log
    model._in_flight_hooks = [
        m.register_forward_pre_hook(note) for layer in layers for m in (layer.self_attn, layer.mlp)
    ]


def in_flight(model: nn.Module) -> list[int]:
    """The all-reduces in flight as each module started, in order, since ``start_counting``; the hooks removed."""
    for hook in model._in_flight_hooks:
        hook.remove()
    return list(model._in_flight_log)
