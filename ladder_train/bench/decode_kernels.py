"""The kernels one compiled decode step launches, counted from the code inductor generates for it: per step and
per layer (a model of two layers minus one of one layer), split into inductor's own fused kernels and the library
calls it makes (matrix products, attention). On the CPU the fused kernels are C++ loops where a GPU gets Triton
kernels, so the split into fused kernels is the CPU's; the library calls are the same ops on both."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

# a generated `call()` launches a fused kernel as `cpp_fused_...(...)` / `triton_..._.run(...)`, a library call as
# `extern_kernels.mm(...)` or an aten op `torch.ops.aten.<op>.<overload>(...)`
_FUSED = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+)(?:\.run)?\(", re.M)
_LIBRARY = re.compile(r"^\s+(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?)\(", re.M)


@dataclass(frozen=True)
class KernelCount:
    fused: int
    library: dict[str, int]

    @property
    def total(self) -> int:
        return self.fused + sum(self.library.values())

    def __sub__(self, other: KernelCount) -> KernelCount:
        names = set(self.library) | set(other.library)
        library = {n: self.library.get(n, 0) - other.library.get(n, 0) for n in sorted(names)}
        return KernelCount(self.fused - other.fused, {n: c for n, c in library.items() if c})


def count_launches(code: str) -> KernelCount:
    """The launches of the ``call`` function of one module of inductor's generated code."""
    call = code[code.index("def call(") :]
    call = call[: call.index("\ndef ", 1)] if "\ndef " in call[1:] else call
    library: dict[str, int] = {}
    for name in _LIBRARY.findall(call):
        library[name] = library.get(name, 0) + 1
    return KernelCount(len(_FUSED.findall(call)), library)


def decode_step_kernels(args, device: torch.device | str = "cpu", prompt: int = 4) -> KernelCount:
    """The launches of one compiled decode step (batch 1) of a model of ``args`` with random weights, as
    ``Generator`` compiles it (inductor)."""
    from torch._inductor.utils import run_and_get_code

    from ..inference.generate import Generator
    from ..model import Transformer

    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(args).eval()
    generator = Generator(model, compile=True)
    generator.setup(1, prompt + 4)
    generator.prefill(torch.zeros(1, prompt, dtype=torch.long, device=device))
    _, codes = run_and_get_code(generator.decode_step, torch.zeros(1, dtype=torch.long, device=device), prompt)
    return count_launches(codes[-1])


def per_layer(args_of, device: torch.device | str = "cpu") -> tuple[KernelCount, KernelCount]:
    """(a decode step of two layers, what each layer adds): ``args_of(n_layers)`` makes the model's args."""
    two = decode_step_kernels(args_of(2), device)
    return two, two - decode_step_kernels(args_of(1), device)
