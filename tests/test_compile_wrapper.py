"""parallel.compile_wrapper=cpp: inductor writes the host code around a compiled block's kernels in C++. Its
speed is a GPU question (benchmarks/train_ab.py emulates it on the CPU); here, on the CPU with real code
generation, the blocks' forward and backward are C++-wrapped and compute what the eager blocks do."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from ladder_train.model import Transformer
from ladder_train.model.transformer import ModelArgs
from ladder_train.parallel.apply import apply_compile


def _loss_and_grads(model: Transformer, tokens: torch.Tensor):
    loss = model(tokens).float().square().mean()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


# inductor's CPU code generation imports a torch.jit decorator that torch 2.13 deprecates: nothing here to act on
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_cpp_wrapped_blocks_train_as_the_eager_blocks_do():
    torch.manual_seed(0)
    eager = Transformer(ModelArgs(vocab_size=64, dim=32, n_layers=2, n_heads=2, ffn_dim=64, max_seq_len=16))
    eager.init_rope()
    compiled = copy.deepcopy(eager)
    apply_compile(compiled, backend="inductor", wrapper="cpp")
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    (loss, grads), codes = run_and_get_code(_loss_and_grads, compiled, tokens)
    eager_loss, eager_grads = _loss_and_grads(eager, tokens)

    # one kind of block: one forward and one backward graph, each a C++ wrapper (a Python one defines call())
    assert len(codes) == 2
    assert all("CppWrapperCodeCache" in code and "def call(" not in code for code in codes)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == eager_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)
