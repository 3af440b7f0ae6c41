"""Starting a run from saved weights: ``checkpoint.init_from`` reads a Hugging Face Llama folder or a training
checkpoint into the (FSDP-sharded) training model, under the recipe's own residual layout (the conversion to a hybrid
ladder); ``train.freeze_layers`` keeps the lower blocks fixed; a model that does not fit the recipe is refused in one
line before anything is built."""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from test_loading import LLAMA31_SCALING, TOKENS, hf_llama

from ladder_train import load_model
from ladder_train.config import load_config
from ladder_train.errors import InputError
from ladder_train.model import ModelArgs, Transformer

SEQ, GLOBAL, MICRO = 16, 4, 2


def hf_llama_model(max_seq_len: int) -> dict:
    """The model.* overrides of hf_llama's shape (3 layers, hidden 32, 4 heads, 2 kv heads, untied head, llama3
    rope), at context ``max_seq_len``."""
    return {
        "model.vocab_size": 97,
        "model.dim": 32,
        "model.n_layers": 3,
        "model.n_heads": 4,
        "model.n_kv_heads": 2,
        "model.ffn_dim": 64,
        "model.max_seq_len": max_seq_len,
        "model.rope_theta": 500000.0,
        "model.tie_embeddings": False,
        "model.rope_scaling": "{" + ", ".join(f"{k}: {v}" for k, v in LLAMA31_SCALING.items()) + "}",
    }


def adapt_config(run_dir, init_from, **extra):
    """A recipe of hf_llama's shape as a hybrid ladder, training on ``batches``."""
    overrides = {
        "run.dir": run_dir,
        **hf_llama_model(48),  # shorter than the folder's 64: the rope table length may differ
        "model.residual": "ladder",
        "model.ladder_layers": 2,
        "data.seq_len": SEQ,
        "train.global_batch_size": GLOBAL,
        "train.micro_batch_size": MICRO,
        "train.max_steps": 2,
        "train.log_every": 1,
        "train.optimizer.lr": 1e-2,
        "train.schedule.warmup_steps": 0,
        "train.schedule.total_steps": 2,
        "wandb.mode": "disabled",
        "eval.at_end": False,
        "checkpoint.init_from": init_from,
        **extra,
    }
    return load_config(None, [f"{k}={'null' if v is None else v}" for k, v in overrides.items()])


def batches(rank, world):
    while True:
        tokens = torch.randint(0, 97, (GLOBAL, SEQ + 1), generator=torch.Generator().manual_seed(0))
        mine = tokens[rank * GLOBAL // world : (rank + 1) * GLOBAL // world]
        for start in range(0, len(mine), MICRO):
            yield mine[start : start + MICRO, :-1], mine[start : start + MICRO, 1:]


def full(param):
    return param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone()


def _adapt_worker(run_dir, init_from, freeze):
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = adapt_config(run_dir, init_from, **{"train.freeze_layers": freeze})
        trainer = Trainer(cfg, env, batches=batches(env.rank, env.world_size))
        with torch.no_grad():
            logits = trainer.model(TOKENS[:, :SEQ]).detach()
        before = {name: full(p) for name, p in trainer.model.named_parameters()}
        trainer.train()
        after = {name: full(p) for name, p in trainer.model.named_parameters()}
        trainable = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    finally:
        dist.destroy_process_group()
    return logits, before, after, trainable


def as_hybrid_ladder(model: Transformer, ladder_layers: int) -> Transformer:
    """The same weights under a hybrid-ladder layout: what the conversion computes before any retraining."""
    args = ModelArgs(**{**dataclasses.asdict(model.args), "residual": "ladder", "ladder_layers": ladder_layers})
    hybrid = Transformer(args).eval()
    hybrid.load_state_dict(model.state_dict())
    return hybrid


@pytest.mark.slow
def test_a_llama_folder_becomes_a_hybrid_ladder_on_two_fsdp_ranks_with_frozen_lower_layers(tmp_path):
    hf_llama(tmp_path / "hf")
    source = load_model(tmp_path / "hf").eval()
    with torch.no_grad():
        expected = as_hybrid_ladder(source, 2)(TOKENS[:, :SEQ])
        assert (expected - source(TOKENS[:, :SEQ])).abs().max() > 1e-3  # the conversion changes the function
    results = run_ranks(_adapt_worker, 2, str(tmp_path / "run"), str(tmp_path / "hf"), 1)
    for logits, before, after, trainable in results:
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)  # the folder's weights, sharded
        for name, value in source.state_dict().items():
            torch.testing.assert_close(before[name], value)
        frozen = [n for n in before if n.startswith("layers.0.")]
        assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)  # layer 0 never moves
        assert all(not torch.equal(before[n], after[n]) for n in before if n.startswith("layers.2.attention.w"))
        assert not torch.equal(before["output.weight"], after["output.weight"])
        n_frozen = sum(before[n].numel() for n in frozen)
        assert trainable == sum(v.numel() for v in before.values()) - n_frozen


def _checkpoint_then_adapt(tmp):
    """A standard run saves a checkpoint; a second run starts a hybrid ladder from it."""
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        first = adapt_config(f"{tmp}/first", None, **{"model.residual": "standard", "model.ladder_layers": None})
        Trainer(first, env, batches=batches(env.rank, env.world_size)).train()
        second = Trainer(adapt_config(f"{tmp}/second", f"{tmp}/first/checkpoints/step-2"), env, batches=[])
        with torch.no_grad():
            logits = second.model(TOKENS[:, :SEQ])
    finally:
        dist.destroy_process_group()
    return logits


@pytest.mark.slow
def test_a_training_checkpoint_starts_a_converted_run(tmp_path):
    hf_llama(tmp_path / "hf")  # only its shape is used: the first run starts from random weights
    (logits,) = run_ranks(_checkpoint_then_adapt, 1, str(tmp_path))
    trained = load_model(tmp_path / "first" / "checkpoints" / "step-2").eval()
    with torch.no_grad():
        torch.testing.assert_close(logits, as_hybrid_ladder(trained, 2)(TOKENS[:, :SEQ]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model.dim": 64, "model.n_heads": 8, "model.n_kv_heads": 4}, "dim 32 there, 64 in the recipe; n_heads 4"),
        ({"model.tie_embeddings": True}, "tie_embeddings False there, True in the recipe"),
        ({"model.rope_scaling": "null"}, "rope_scaling {'rope_type': 'llama3'"),
    ],
)
def test_a_model_that_does_not_fit_the_recipe_is_refused_in_one_line(tmp_path, capsys, change, message):
    from ladder_train.cli import main

    hf_llama(tmp_path / "hf")
    capsys.readouterr()  # transformers' progress bar
    overrides = {
        "run.dir": tmp_path / "run",
        **hf_llama_model(64),
        "data.source": "python-stdlib",
        "data.tokenizer": "byte",
        "data.seq_len": 16,
        "wandb.mode": "disabled",
        "checkpoint.init_from": tmp_path / "hf",
        **change,
    }
    status = main([f"{k}={v}" for k, v in overrides.items()])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith(f"ladder-train: error: checkpoint.init_from={tmp_path / 'hf'}: ")
    assert message in err and "\n" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before anything was built


def test_init_from_refuses_a_preset_a_missing_folder_and_a_second_start(tmp_path):
    from ladder_train.config import ConfigError
    from ladder_train.loading import check_init_source

    args = ModelArgs(vocab_size=97, dim=32, n_layers=3, n_heads=4, ffn_dim=64)
    with pytest.raises(InputError, match=r"^checkpoint.init_from=tiny: a preset has no weights"):
        check_init_source("tiny", args)
    with pytest.raises(InputError, match=r"^checkpoint.init_from: .*nowhere.* is neither a model preset"):
        check_init_source(tmp_path / "nowhere", args)
    with pytest.raises(ConfigError, match="'checkpoint.init_from' and 'checkpoint.load' are both set"):
        load_config(None, ["checkpoint.init_from=a", "checkpoint.load=b"])
    with pytest.raises(ConfigError, match=r"'train.freeze_layers'=5 must lie in \[0, model.n_layers=4\]"):
        load_config(None, ["model.n_layers=4", "train.freeze_layers=5"])


def _smollm2_worker(folder, run_dir):
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = load_config(
            Path(__file__).resolve().parents[1] / "recipes" / "adapt_smollm2_ladder15.yaml",
            [f"checkpoint.init_from={folder}", f"run.dir={run_dir}", "wandb.mode=disabled"],
        )
        trainer = Trainer(cfg, env, batches=[])  # the recipe's shape against the real folder; no data read
        with torch.no_grad():
            logits = trainer.model(SMOLLM2_TOKENS)
        layouts = trainer.model.args.layer_layouts()
    finally:
        dist.destroy_process_group()
    return logits, layouts


SMOLLM2_TOKENS = torch.tensor([[504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 7042, 314]])


@pytest.mark.slow
def test_the_smollm2_recipe_converts_the_real_model(smollm2, tmp_path):
    """recipes/adapt_smollm2_ladder15.yaml fits the real SmolLM2 folder, and the run starts from its weights wired
    as a hybrid ladder: the logits of load_model's model under the same layout."""
    (logits, layouts) = run_ranks(_smollm2_worker, 1, str(smollm2), str(tmp_path / "run"))[0]
    assert layouts == ["standard"] * 15 + ["ladder"] * 15
    source = load_model(smollm2).eval()
    with torch.no_grad():
        torch.testing.assert_close(logits, as_hybrid_ladder(source, 15)(SMOLLM2_TOKENS), atol=1e-4, rtol=1e-4)
        assert (logits - source(SMOLLM2_TOKENS)).abs().max() > 0.1  # the conversion changes what it computes
