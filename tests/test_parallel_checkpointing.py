"""Selective activation checkpointing (parallel.activation_checkpoint=selective): the loss and gradients of no
checkpointing, less memory held for backward, no matmul or attention computed twice; and on 2 FSDP2 ranks, eager
and compiled (aot_eager), the eager numbers."""

import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from dist_utils import run_ranks
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.activation_memory import compare_modes
from ladder_train.model import ModelArgs, Transformer
from ladder_train.parallel.apply import apply_activation_checkpointing

LAYOUTS = ("standard", "parallel", "ladder")
aten = torch.ops.aten
ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default  # the CPU kernel of F.scaled_dot_product_attention


def tiny_model(layout: str) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        ModelArgs(vocab_size=128, dim=64, n_layers=2, n_heads=4, ffn_dim=128, max_seq_len=64, residual=layout)
    )


def tiny_batch():
    tokens = torch.randint(0, 128, (2, 65), generator=torch.Generator().manual_seed(1))
    return tokens[:, :-1], tokens[:, 1:]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_selective_gives_the_loss_and_gradients_of_none_holding_less(layout):
    results = compare_modes(tiny_model(layout), *tiny_batch())
    none, selective, full = results["none"], results["selective"], results["full"]
    assert selective["loss"] == pytest.approx(none["loss"], rel=1e-6)
    assert selective["max_grad_diff"] <= 1e-6 and full["max_grad_diff"] <= 1e-6
    # held for backward: every block's matmul and attention outputs (selective), only the block inputs (full)
    assert full["held_after_forward_bytes"] < selective["held_after_forward_bytes"] < none["held_after_forward_bytes"]
    assert selective["held_after_forward_bytes"] < 0.8 * none["held_after_forward_bytes"]
    assert selective["peak_bytes"] < none["peak_bytes"]


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def backward_ops(mode: str) -> collections.Counter:
    """The aten ops that run in backward of a 2-layer ladder under ``mode``: the gradients' and any recompute."""
    model = copy.deepcopy(tiny_model("ladder"))
    apply_activation_checkpointing(model, mode, 2)
    inputs, labels = tiny_batch()
    loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
    with OpCounter() as counter:
        loss.backward()
    return counter.counts


def test_selective_recomputes_norms_and_activations_but_no_matmul_or_attention():
    none, selective, full = backward_ops("none"), backward_ops("selective"), backward_ops("full")
    assert selective[aten.mm.default] == none[aten.mm.default] == 30  # the gradients' matmuls only
    assert selective[ATTENTION] == none[ATTENTION] == 0
    # 2 layers x 2 norms recomputed (rsqrt), 2 SwiGLU activations (silu); none recomputes nothing
    assert (selective[aten.rsqrt.default], selective[aten.silu.default]) == (4, 2)
    assert none[aten.rsqrt.default] == none[aten.silu.default] == 0
    # full recomputes each block's forward, attention included: 6 of its 7 matmuls (the recompute stops early, before
    # w_down, whose output no gradient needs)
    assert full[aten.mm.default] == 30 + 2 * 6 and full[ATTENTION] == 2


def test_the_benchmark_writes_the_rows_its_docs_table_is_made_from(tmp_path, capsys):
    from benchmarks.activation_memory import main
    from tools.docs_tables import MANIFEST, TABLES

    ACTIVATION_MEMORY = MANIFEST["activation-memory"].rows

    tiny = [
        "model.vocab_size=128",
        "model.dim=64",
        "model.n_layers=2",
        "model.ffn_dim=128",
        "model.max_seq_len=64",
        "data.seq_len=64",
        "train.micro_batch_size=2",
    ]
    main(["--layouts", "ladder", "--out", str(tmp_path / ACTIVATION_MEMORY), *tiny])
    rows = (tmp_path / ACTIVATION_MEMORY).read_text().splitlines()
    assert [line.split('"mode": "')[1].split('"')[0] for line in rows] == ["none", "selective", "full"]
    table = TABLES["activation-memory"](tmp_path).splitlines()
    assert len(table) == 2 + 3 and table[2].startswith("| ladder | none |") and "| 1.00 |" in table[2]
    assert "wrote 3 rows" in capsys.readouterr().out


@pytest.mark.slow
def test_selective_with_fsdp_two_ranks_eager_and_compiled_gives_the_losses_of_none(tmp_path):
    from test_train import STEPS, _train_compiled

    runs = [("none", False), ("selective", False), ("selective", True)]
    results = run_ranks(_train_compiled, 2, str(tmp_path), runs)
    assert results[0] == results[1]  # every rank logs the same numbers and compiles the same graphs
    plain, _, _, _ = results[0]["none", False]
    eager, _, eager_graphs, _ = results[0]["selective", False]
    compiled, breaks, graphs, _ = results[0]["selective", True]
    # the ladder's first block, then the others, and the loss
    assert eager_graphs == 0 and breaks == {} and 2 <= graphs <= 3
    assert len(plain) == len(eager) == len(compiled) == STEPS
    for (loss_p, norm_p), (loss_e, norm_e), (loss_c, norm_c) in zip(plain, eager, compiled, strict=True):
        assert loss_e == pytest.approx(loss_p, rel=1e-6) and norm_e == pytest.approx(norm_p, rel=1e-6)
        assert loss_c == pytest.approx(loss_e, rel=1e-5) and norm_c == pytest.approx(norm_e, rel=1e-5)
