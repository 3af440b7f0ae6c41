"""The desync layout in its own block class (model/desync.py ``DesyncBlock``): the Transformer picks it per layer from
the config, it keeps a standard layer's parameter names, and the attention and MLP it is made of (model/modules.py)
see one stream (B, T, D) only, the emulated (t, B, T, D) stream tensor staying inside the block. Its arithmetic
against the ranks written out by hand: tests/test_model_desync.py."""

import pytest
import torch

from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.desync import DesyncBlock
from ladder_train.model.modules import MLP, Attention
from ladder_train.model.transformer import Block

SHAPE = dict(vocab_size=61, dim=32, n_layers=4, n_heads=4, ffn_dim=48, max_seq_len=24)


def test_the_config_picks_each_layers_block_class():
    model = Transformer(ModelArgs(**SHAPE, residual="desync", desync_tp=2, desync_layers=2))
    assert [type(layer) for layer in model.layers] == [Block, Block, DesyncBlock, DesyncBlock]
    assert [layer.layout for layer in model.layers] == ["standard"] * 2 + ["desync"] * 2
    assert [(layer.reduce_attention, layer.reduce_mlp) for layer in model.layers[2:]] == [(False, True)] * 2
    for residual in ("standard", "parallel", "ladder"):
        model = Transformer(ModelArgs(**SHAPE, residual=residual))
        assert all(type(layer) is Block for layer in model.layers)
    with pytest.raises(ValueError, match=r"not 'desync' \(desync: model/desync.py\)"):
        Block(ModelArgs(**SHAPE, residual="desync", desync_tp=2), "desync")


def test_a_desync_model_has_the_standard_models_parameter_names_and_shapes():
    desync = Transformer(ModelArgs(**SHAPE, residual="desync", desync_tp=4, n_kv_heads=2))
    standard = Transformer(ModelArgs(**SHAPE, n_kv_heads=2))
    assert {k: v.shape for k, v in desync.state_dict().items()} == {
        k: v.shape for k, v in standard.state_dict().items()
    }


@pytest.mark.parametrize("t, kv_heads", [(2, 4), (4, 2)], ids=["t=2", "t=4 above 2 kv heads"])
def test_the_modules_see_one_stream_only(monkeypatch, t, kv_heads):
    """Forward, cached prefill and decode of an emulated desync model (every module's input one of t streams, or
    synchronised): the attention's projections and the MLP's input are always (B, T, features)."""
    shapes = []
    attend, mlp_forward = Attention.attend, MLP.forward

    def spy_attend(self, q, k, v, *rest):
        shapes.extend(x.dim() for x in (q, k, v))
        return attend(self, q, k, v, *rest)

    def spy_mlp(self, x):
        shapes.append(x.dim())
        return mlp_forward(self, x)

    monkeypatch.setattr(Attention, "attend", spy_attend)
    monkeypatch.setattr(MLP, "forward", spy_mlp)
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**SHAPE, residual="desync", desync_tp=t, n_kv_heads=kv_heads, desync_layers=3))
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
        model.setup_kv_cache(2, 12)
        model(ids[:, :8], 0)
        model(ids[:, 8:], torch.tensor(8))
    # per call: 4 layers' q, k, v; the MLP called whole in the standard layer only (desync: stream projections)
    assert len(shapes) == 3 * (4 * 3) + 3 * 1 and set(shapes) == {3}
