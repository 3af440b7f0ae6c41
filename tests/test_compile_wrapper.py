"""The host's work around compiled blocks. parallel.compile_wrapper=cpp: inductor writes the host code around a
compiled block's kernels in C++. parallel.cuda_graphs: inductor records a graph's kernels on a GPU once and replays
them. Their speed is a GPU question (benchmarks/train_ab.py emulates the first on the CPU); here, on the CPU with real
code generation, the blocks' forward and backward are C++-wrapped, the CUDA graphs reach inductor (which skips them
for CPU tensors), and both compute what the eager model does."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters
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


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_cuda_graphs_reach_inductor_and_train_as_the_eager_model_does():
    """Two steps of the blocks and the loss compiled with CUDA graphs on: inductor counts one skipped recording per
    forward graph (a block kind and the loss; no CUDA device) and none without them; the losses and gradients are
    eager's."""
    torch.manual_seed(0)
    eager = Transformer(ModelArgs(vocab_size=64, dim=32, n_layers=2, n_heads=2, ffn_dim=64, max_seq_len=16))
    eager.init_rope()
    gen = torch.Generator().manual_seed(1)
    tokens, labels = torch.randint(0, 64, (2, 8), generator=gen), torch.randint(0, 64, (2, 8), generator=gen)

    def two_steps(model):
        losses = []
        for _ in range(2):
            torch.compiler.cudagraph_mark_step_begin()
            loss = model(tokens, labels=labels)
            loss.backward()
            losses.append(loss.detach())
        return losses, {name: p.grad.clone() for name, p in model.named_parameters()}

    expected_losses, expected_grads = two_steps(eager)
    for cuda_graphs, skips in ((False, 0), (True, 2)):
        torch._dynamo.reset()
        counters.clear()
        compiled = copy.deepcopy(eager)
        compiled.zero_grad(set_to_none=True)
        apply_compile(compiled, backend="inductor", cuda_graphs=cuda_graphs)
        losses, grads = two_steps(compiled)
        assert counters["inductor"]["cudagraph_skips"] == skips
        torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)
