"""Loading saved models (ladder_train/loading.py): what a folder is (an export, a training checkpoint or neither);
Hugging Face Llama folders written by transformers itself (sharded, untied head, Llama-3.1 rope scaling) give
transformers' logits, whole and at TP = 2; unsupported configs are refused in one line; exports round-trip and the
non-Llama layouts do not pass for a Llama; a real pretrained model, SmolLM2-135M-Instruct, answers as it should.
And starting a run from saved weights: ``checkpoint.init_from`` reads a Hugging Face Llama folder or a training
checkpoint into the (FSDP-sharded) training model, under the recipe's own residual layout (the conversion to a
hybrid ladder); ``train.freeze_layers`` keeps the lower blocks fixed; a model that does not fit the recipe is
refused in one line before anything is built."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_utils import run_ranks

from ladder_train import load_model
from ladder_train.config import load_config
from ladder_train.errors import InputError
from ladder_train.folders import folder_kind, run_config_path
from ladder_train.inference import Generator
from ladder_train.loading import load_tp_shard
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import INDEX_FILE, LADDER_MODEL_TYPE, save_export
from ladder_train.parallel import free_port

transformers = pytest.importorskip("transformers")

# Hugging Face Llama folders ----------------------------------------------------------------------------------

LLAMA31_SCALING = {  # Llama-3.1's values, with an original context short enough for a 40-token test to cross
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
TOKENS = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(3))


def hf_llama(folder, tie=False, rope_scaling=LLAMA31_SCALING, **changes):
    """A random tiny LlamaForCausalLM saved by transformers in shards (as hub checkpoints are); returns its logits."""
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
        rope_scaling=dict(rope_scaling),  # a copy: transformers adds rope_theta to it
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms start at ones; perturb them so a wrongly read norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder, max_shard_size="40KB", safe_serialization=True)
    if changes:
        config_path = folder / "config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **changes}))
    with torch.no_grad():
        return model(TOKENS).logits


@pytest.mark.parametrize("tie", [False, True])
def test_a_transformers_llama_folder_gives_its_logits(tmp_path, tie):
    expected = hf_llama(tmp_path / "hf", tie=tie)
    assert (tmp_path / "hf" / INDEX_FILE).is_file()  # sharded
    model = load_model(tmp_path / "hf").eval()
    assert model.args.tie_embeddings is tie and model.args.rope_scaling["factor"] == 8.0
    assert (model.output is None) is tie
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(load_tp_shard(tmp_path / "hf")(TOKENS), expected, atol=1e-5, rtol=1e-5)


def test_without_rope_scaling_the_logits_differ(tmp_path):
    """The scaling is applied (the test above would pass by accident if positions stayed below 16)."""
    expected = hf_llama(tmp_path / "hf")
    plain = load_model(tmp_path / "hf").eval()
    plain.args.rope_scaling = None
    plain.init_rope()
    with torch.no_grad():
        assert (plain(TOKENS) - expected).abs().max() > 1e-3


def _tp_worker(rank, world, port, folder, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from ladder_train.inference import TPCommunicator

    model = load_tp_shard(folder, tp_rank=rank, tp_size=world)
    model.set_communicator(TPCommunicator("sync"))
    with torch.no_grad():
        logits = model(TOKENS)
    greedy = Generator(model, dist.group.WORLD).generate(TOKENS[:, :8], 6)
    torch.save(
        {"logits": logits, "greedy": greedy, "rows": model.layers[0].attention.wq.weight.shape[0]}, out / f"{rank}.pt"
    )
    dist.destroy_process_group()


@pytest.mark.slow
def test_tp2_reads_each_rank_slices_across_shards(tmp_path):
    expected = hf_llama(tmp_path / "hf")
    mp.spawn(_tp_worker, args=(2, free_port(), tmp_path / "hf", tmp_path), nprocs=2, join=True)
    reference = Generator(load_model(tmp_path / "hf").eval(), None).generate(TOKENS[:, :8], 6)
    for rank in range(2):
        result = torch.load(tmp_path / f"{rank}.pt")
        assert result["rows"] == 16  # half of 4 heads x 8
        torch.testing.assert_close(result["logits"], expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(result["greedy"], reference)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attention_bias": True}, "attention_bias=True: biases are not supported"),
        ({"mlp_bias": True}, "mlp_bias=True: biases are not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu': only silu"),
        ({"model_type": "mistral"}, "model_type='mistral': only Llama models"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters.rope_type='yarn': only llama3"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "rope_parameters: missing low_freq_factor"),
        ({"head_dim": 16}, "head_dim=16: only hidden_size / num_attention_heads"),
    ],
)
def test_unsupported_configs_are_refused_in_one_line(tmp_path, change, message):
    hf_llama(tmp_path / "hf", **change)
    with pytest.raises(InputError) as err:
        load_model(tmp_path / "hf")
    assert str(err.value).startswith(f"{tmp_path / 'hf' / 'config.json'}: {message}") and "\n" not in str(err.value)


def test_exports_round_trip_and_only_standard_claims_to_be_llama(tmp_path):
    expected = hf_llama(tmp_path / "hf")
    model = load_model(tmp_path / "hf").eval()
    out = save_export(model, tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is False
    assert config["rope_scaling"] == LLAMA31_SCALING
    again = transformers.LlamaForCausalLM.from_pretrained(out).eval()  # transformers reads our export
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS).logits, expected, atol=1e-5, rtol=1e-5)

    model.args.residual, model.args.ladder_layers = "ladder", 2  # the same weights as a hybrid ladder
    ladder = save_export(model, tmp_path / "ladder")
    config = json.loads((ladder / "config.json").read_text())
    assert config["model_type"] == LADDER_MODEL_TYPE and config["architectures"] == ["LadderLlamaForCausalLM"]
    auto = transformers.AutoModelForCausalLM.from_pretrained(ladder)  # its own class, not a Llama (tests/test_hf.py)
    assert type(auto).__name__ == "LadderLlamaForCausalLM"
    assert load_model(ladder).args.layer_layouts() == ["standard", "ladder", "ladder"]


# a real pretrained model ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_answers_paris_and_matches_transformers(smollm2, shared_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"  # its template
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    model = load_model(smollm2).eval()
    assert model.args.n_layers == 30 and model.args.n_kv_heads == 3 and model.args.tie_embeddings
    answer = tokenizer.decode(Generator(model, None).generate(ids, 8)[0].tolist())  # the new tokens
    assert "Paris" in answer, answer
    model.clear_kv_cache()  # the generator leaves its cache installed for the next call
    reference = transformers.LlamaForCausalLM.from_pretrained(smollm2).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids).logits, atol=1e-4, rtol=1e-4)
    # it knows English text: FineWeb-Edu perplexity 26.45 here (4 x 4 packed windows of 512 tokens, measured
    # 2026-11-25; ../shared quotes 23.4 on 20 whole documents); a random model would be near 49,152
    from ladder_train.evaluation.perplexity import held_out_batches, perplexity, validation_loss

    batches = held_out_batches(shared_dir / "data" / "fineweb-edu", tokenizer, 512, 4, 4)
    loss, n_tokens = validation_loss(model, batches)
    assert n_tokens == 4 * 4 * 512 and 20 < perplexity(loss) < 35


def test_folder_kind_tells_an_export_a_checkpoint_and_neither(tmp_path):
    export = save_export(
        Transformer(ModelArgs(vocab_size=97, dim=32, n_layers=1, n_heads=4, ffn_dim=64)), tmp_path / "e"
    )
    assert folder_kind(export) == "export"
    step = tmp_path / "run" / "checkpoints" / "step-4"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    assert folder_kind(step) == "incomplete checkpoint"
    (step / "COMPLETE").write_text("step 4\n")
    assert folder_kind(step) == "checkpoint"
    assert run_config_path(step) == (tmp_path / "run" / "config.yaml").resolve()
    assert folder_kind(tmp_path / "run") is None and folder_kind(tmp_path / "nowhere") is None
    (tmp_path / "only-config").mkdir()
    (tmp_path / "only-config" / "config.json").write_text("{}")
    assert folder_kind(tmp_path / "only-config") is None


# starting a run from saved weights (checkpoint.init_from) ----------------------------------------------------

SEQ, GLOBAL, MICRO = 16, 4, 2


def adapt_config(run_dir, init_from, **extra):
    """A recipe of hf_llama's shape (3 layers, hidden 32, 4 heads, 2 kv heads, untied head, llama3 rope)."""
    scaling = "{" + ", ".join(f"{k}: {v}" for k, v in LLAMA31_SCALING.items()) + "}"
    overrides = {
        "run.dir": run_dir,
        "model.vocab_size": 97,
        "model.dim": 32,
        "model.n_layers": 3,
        "model.n_heads": 4,
        "model.n_kv_heads": 2,
        "model.ffn_dim": 64,
        "model.max_seq_len": 48,  # shorter than the folder's 64: the rope table length may differ
        "model.rope_theta": 500000.0,
        "model.tie_embeddings": False,
        "model.rope_scaling": scaling,
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
    scaling = "{" + ", ".join(f"{k}: {v}" for k, v in LLAMA31_SCALING.items()) + "}"
    overrides = {
        "run.dir": tmp_path / "run",
        "model.vocab_size": 97,
        "model.dim": 32,
        "model.n_layers": 3,
        "model.n_heads": 4,
        "model.n_kv_heads": 2,
        "model.ffn_dim": 64,
        "model.max_seq_len": 64,
        "model.rope_theta": 500000.0,
        "model.tie_embeddings": False,
        "model.rope_scaling": scaling,
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


# crafted and ill-formed model folders: refused in one line (exit 2) before any weight is read --------------------

SMALL = dict(vocab_size=97, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, tie_embeddings=False)


def small_export(folder):
    """A tiny untied export (1 layer, hidden 32, 4 heads over 2 kv heads): the folder the crafts below change."""
    torch.manual_seed(0)
    return save_export(Transformer(ModelArgs(**SMALL)), folder)


def set_config(**changes):
    def craft(folder):
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return craft


def write_file(name, content):
    def craft(folder):
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())

    return craft


def change_tensors(change):
    def craft(folder):
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        change(tensors)
        save_file(tensors, folder / "model.safetensors")

    return craft


def index_to(shard):
    """An index that lists every tensor in ``shard`` (the real file stays beside it)."""

    def craft(folder):
        from safetensors import safe_open

        with safe_open(folder / "model.safetensors", framework="pt") as handle:
            names = list(handle.keys())
        other = folder.parent / "other"  # a real file outside the folder, for the ../ entry to reach
        other.mkdir(exist_ok=True)
        (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": dict.fromkeys(names, shard)}))

    return craft


Q_PROJ = "model.layers.0.self_attn.q_proj"
CRAFTED_FOLDERS = {  # id: (craft, the file the line names, the message after it)
    "config not JSON": (write_file("config.json", "{oops"), "config.json", "not valid JSON ("),
    "config a list": (write_file("config.json", "[1, 2]"), "config.json", "not a JSON object (a list)"),
    "null size": (set_config(hidden_size=None), "config.json", "hidden_size=None: must be a positive integer"),
    "float size": (set_config(hidden_size=32.0), "config.json", "hidden_size=32.0: must be a positive integer"),
    "string size": (set_config(num_hidden_layers="1"), "config.json", "num_hidden_layers='1': must be a positive"),
    "zero heads": (set_config(num_attention_heads=0), "config.json", "num_attention_heads=0: must be a positive"),
    "heads do not divide": (
        set_config(hidden_size=64, num_attention_heads=5),
        "config.json",
        "num_attention_heads=5: does not divide hidden_size=64",
    ),
    "odd head dim": (
        set_config(hidden_size=36),
        "config.json",
        "hidden_size / num_attention_heads = 9: the head dimension must be even",
    ),
    "kv heads": (set_config(num_key_value_heads=3), "config.json", "num_key_value_heads=3: does not divide num_att"),
    "3e9 vocab": (
        set_config(vocab_size=3 * 10**9),
        "config.json",
        "vocab_size=3000000000: must be a positive integer, at most 16,777,216",
    ),
    "huge tensor": (
        set_config(vocab_size=2**24, hidden_size=2048, num_attention_heads=16),
        "config.json",
        "vocab_size=16777216 and hidden_size=2048 make a tensor of 34,359,738,368 elements, more than 2**34",
    ),
    "negative eps": (set_config(rms_norm_eps=-1e-5), "config.json", "rms_norm_eps=-1e-05: must be a positive number"),
    "ladder layers": (
        set_config(residual="ladder", ladder_layers=5),
        "config.json",
        "ladder_layers=5: must be an integer in [0, num_hidden_layers=1]",
    ),
    "rope factor": (
        set_config(rope_scaling={**LLAMA31_SCALING, "factor": "8"}),
        "config.json",
        "rope_scaling.factor='8': must be a positive number",
    ),
    "tie not bool": (set_config(tie_word_embeddings="no"), "config.json", "tie_word_embeddings='no': must be true"),
    "q_proj.bias": (
        change_tensors(lambda t: t.update({f"{Q_PROJ}.bias": torch.zeros(32)})),
        "model.safetensors",
        f"unexpected tensor {Q_PROJ}.bias: config.json implies no such weight",
    ),
    "missing tensor": (
        change_tensors(lambda t: t.pop("model.norm.weight")),
        "model.safetensors",
        "missing tensor model.norm.weight, which config.json implies",
    ),
    "misshaped": (
        change_tensors(lambda t: t.update({f"{Q_PROJ}.weight": torch.zeros(30, 32)})),
        "model.safetensors",
        f"tensor {Q_PROJ}.weight has shape [30, 32], config.json implies [32, 32]",
    ),
    "integer tensor": (
        change_tensors(lambda t: t.update({"model.norm.weight": torch.ones(32, dtype=torch.int64)})),
        "model.safetensors",
        "tensor model.norm.weight has dtype I64, not floating point",
    ),
    "garbage header": (
        write_file("model.safetensors", b"\x10\0\0\0\0\0\0\0{not a header!!}"),
        "model.safetensors",
        "not a readable safetensors file (",
    ),
    "missing shard": (
        index_to("model-00002.safetensors"),
        INDEX_FILE,
        "shard 'model-00002.safetensors' does not exist",
    ),
    "shard outside": (
        index_to("../other/model.safetensors"),
        INDEX_FILE,
        "shard '../other/model.safetensors' is not a file name inside the folder",
    ),
    "index not JSON": (write_file(INDEX_FILE, "nope"), INDEX_FILE, "not valid JSON ("),
}


@pytest.mark.parametrize("case", CRAFTED_FOLDERS)
def test_a_crafted_folder_is_refused_in_one_line_whole_and_at_tp2(tmp_path, case):
    craft, file, message = CRAFTED_FOLDERS[case]
    folder = small_export(tmp_path / "model")
    craft(folder)
    for load in (load_model, lambda f: load_tp_shard(f, tp_rank=0, tp_size=2)):
        with pytest.raises(InputError) as err:
            load(folder)
        assert str(err.value).startswith(f"{folder / file}: {message}"), str(err.value)
        assert "\n" not in str(err.value)


def test_init_from_checks_the_folder_too(tmp_path):
    from ladder_train.loading import check_init_source

    folder = small_export(tmp_path / "model")
    change_tensors(lambda t: t.update({f"{Q_PROJ}.bias": torch.zeros(32)}))(folder)
    with pytest.raises(InputError, match=rf"^checkpoint.init_from: .*unexpected tensor {Q_PROJ}.bias"):
        check_init_source(folder, ModelArgs(**SMALL))


def crafted_checkpoint(tmp_path, trainer: dict) -> Path:
    """A real training checkpoint whose trainer entry is replaced by ``trainer`` (manifest rewritten to match, as an
    attacker could)."""
    import shutil
    import warnings

    import torch.distributed.checkpoint as dcp
    from dist_utils import save_training_checkpoint
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from ladder_train.checkpoint.files import write_manifest
    from ladder_train.checkpoint.safe_load import pack_json
    from ladder_train.folders import COMPLETE_MARKER

    torch.manual_seed(0)
    good = save_training_checkpoint(Transformer(ModelArgs(**SMALL)), tmp_path / "good")
    dcp_to_torch_save(str(good), str(tmp_path / "full.pt"))
    state = {**torch.load(tmp_path / "full.pt", weights_only=False), "trainer": pack_json(trainer)}  # our own file
    step = tmp_path / "run" / "checkpoints" / "step-3"
    shutil.rmtree(step, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=str(step), no_dist=True)
    (step / COMPLETE_MARKER).write_text("crafted\n")
    write_manifest(step)
    return step


MODEL_ARGS = {**dataclasses.asdict(ModelArgs(**SMALL))}
CRAFTED_TRAINER_ENTRIES = {  # id: (trainer entry, the message after "PATH: the trainer entry")
    "unknown key": ({"model_args": {**MODEL_ARGS, "n_experts": 8}}, ": unknown field 'model_args.n_experts'"),
    "zero heads": ({"model_args": {**MODEL_ARGS, "n_heads": 0}}, ": model_args.n_heads=0: must be a positive integer"),
    "string layers": ({"model_args": {**MODEL_ARGS, "n_layers": "1"}}, ": model_args.n_layers='1': must be a positive"),
    "no model_args": ({"step": 3}, " has no model_args (the model's shape)"),
    "model_args a list": ({"model_args": [1]}, ": model_args is not an object"),
    "huge vocab": (
        {"model_args": {**MODEL_ARGS, "vocab_size": 2**24, "dim": 2**23, "n_heads": 2**12, "n_kv_heads": 2**12}},
        ": model_args.vocab_size=16777216 and model_args.dim=8388608 make a tensor of 140,737,488,355,328 elements",
    ),
}


@pytest.mark.parametrize("case", CRAFTED_TRAINER_ENTRIES)
def test_a_crafted_trainer_entry_is_refused_in_one_line_before_any_allocation(tmp_path, monkeypatch, case):
    import ladder_train.loading as loading

    trainer, message = CRAFTED_TRAINER_ENTRIES[case]
    step = crafted_checkpoint(tmp_path, {"step": 3, **trainer})

    def no_build(args):
        raise AssertionError(f"a model was built from {args}")

    monkeypatch.setattr(loading, "build_on_meta", no_build)
    for load in (load_model, load_tp_shard):
        with pytest.raises(InputError) as err:
            load(step)
        assert str(err.value).startswith(f"{step}: the trainer entry{message}"), str(err.value)
        assert "\n" not in str(err.value)


def test_ladder_generate_and_eval_exit_2_with_one_line_on_crafted_input(tmp_path, capsys):
    from ladder_train.cli import ladder_eval, ladder_generate

    folder = small_export(tmp_path / "model")
    set_config(num_attention_heads=5)(folder)
    step = crafted_checkpoint(tmp_path, {"step": 3, "model_args": {**MODEL_ARGS, "n_heads": 0}})
    cases = [
        (ladder_generate, [str(folder), "--prompt", "hi"], f"{folder / 'config.json'}: num_attention_heads=5"),
        (ladder_eval, [str(folder), "--tasks", "x"], f"{folder / 'config.json'}: num_attention_heads=5"),
        (ladder_generate, [str(step), "--prompt", "hi"], f"{step}: the trainer entry: model_args.n_heads=0"),
        (ladder_eval, [str(step), "--tasks", "x"], f"{step}: the trainer entry: model_args.n_heads=0"),
    ]
    for command, argv, message in cases:
        capsys.readouterr()
        status = command(argv)
        err = capsys.readouterr().err.strip()
        assert status == 2 and message in err and "\n" not in err, (argv, status, err)
