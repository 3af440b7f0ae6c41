"""The kernels a compiled decode step launches per layer, counted from inductor's generated code on the CPU
(ladder_train.bench.decode_kernels): what a change to the decode step must lower to make decode less
launch-bound on a card."""

from __future__ import annotations

import pytest

from ladder_train.bench.decode_kernels import KernelCount, count_launches, per_layer
from ladder_train.model import PRESETS
from ladder_train.model.transformer import ModelArgs

MM, SDPA = "extern_kernels.mm", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default"

GENERATED = """
def call(args):
    arg0_1, arg1_1 = args
    buf0 = empty_strided_cpu((1, 64), (64, 1), torch.float32)
    cpp_fused_embedding_mean_mul_pow_rsqrt_0(arg0_1, buf0)
    extern_kernels.mm(buf0, reinterpret_tensor(arg1_1, (64, 64), (1, 64), 0), out=buf1)
    buf2 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(buf1, buf1, buf1)
    cpp_fused_add_1(buf2, buf0)
    return (buf0, )

def benchmark_compiled_module(times=10, repeat=10):
    cpp_fused_never_called_2(x)
"""


def test_the_launches_of_a_generated_call_are_counted_and_nothing_after_it():
    count = count_launches(GENERATED)
    assert count == KernelCount(2, {MM: 1, SDPA: 1}) and count.total == 4
    assert count - KernelCount(1, {MM: 1}) == KernelCount(1, {SDPA: 1})


@pytest.mark.slow
def test_decode_kernels_per_layer_of_each_layout():
    """Per layer: four matrix products (Q, K and V joined, the output projection, gate and up joined, down:
    Transformer.fuse_projections; seven before it) and one attention call, whatever the layout; the fused kernels
    around them (norms, rope, the cache write, SwiGLU's product, the residual adds) are inductor's (torch 2.13's CPU
    code generation: a torch upgrade may move them; the message prints the new counts). Before the joins: 14 a
    layer for standard (6 fused), 13 for parallel and the ladder (5 fused); now 9 and 8."""
    per = {}
    for layout in ("standard", "parallel", "ladder"):
        shape = {**PRESETS["tiny"], "vocab_size": 257, "residual": layout}
        shape.pop("n_layers")
        _, layer = per_layer(lambda n, shape=shape: ModelArgs(**shape, n_layers=n))
        per[layout] = (layer.fused, layer.library)
    assert {k: lib for k, (_, lib) in per.items()} == {k: {MM: 4, SDPA: 1} for k in per}
    # parallel shares one norm between attention and MLP; the ladder's adds fuse into its next norm
    assert {k: fused for k, (fused, _) in per.items()} == {"standard": 4, "parallel": 3, "ladder": 3}, per
