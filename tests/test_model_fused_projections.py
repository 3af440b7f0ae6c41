"""Transformer.fuse_projections: Q, K, V and gate, up each from one matrix product (what the compiled generator
runs), with the parameters, their names and values unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from ladder_train.model import PRESETS, Transformer
from ladder_train.model.transformer import ModelArgs


@pytest.mark.parametrize("layout", ["standard", "parallel", "ladder", "desync"])
def test_joined_projections_give_the_same_logits_and_keep_every_parameter(layout):
    extra = {"desync_tp": 2} if layout == "desync" else {}
    args = ModelArgs(**{**PRESETS["tiny"], "vocab_size": 257, "residual": layout, "n_kv_heads": 2, **extra})
    torch.manual_seed(0)
    model = Transformer(args).eval()
    fused = copy.deepcopy(model)
    fused.fuse_projections()
    state, fused_state = model.state_dict(), fused.state_dict()
    assert list(fused_state) == list(state)  # the joined weights are not saved: no new key
    assert all(torch.equal(fused_state[k], v) for k, v in state.items())
    attention, mlp = fused.layers[0].attention, fused.layers[0].mlp
    # each projection's weight is a view of the joined one: one copy of the weights
    assert attention.wk.weight.untyped_storage().data_ptr() == attention.wqkv.untyped_storage().data_ptr()
    assert mlp.w_up.weight.untyped_storage().data_ptr() == mlp.w_gate_up.untyped_storage().data_ptr()
    assert attention.qkv_rows == [args.dim, 2 * args.head_dim, 2 * args.head_dim]
    tokens = torch.randint(0, 257, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(fused(tokens), model(tokens), rtol=1e-5, atol=1e-5)
        model.setup_kv_cache(2, 16)
        fused.setup_kv_cache(2, 16)
        model(tokens[:, :8], start_pos=0)
        fused(tokens[:, :8], start_pos=0)
        step = model(tokens[:, 8:9], start_pos=torch.tensor(8), last_only=True)
        torch.testing.assert_close(fused(tokens[:, 8:9], start_pos=torch.tensor(8), last_only=True), step)
