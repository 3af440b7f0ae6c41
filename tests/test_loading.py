"""Loading saved models (ladder_train/loading.py): what a folder is (an export, a training checkpoint or neither);
Hugging Face Llama folders written by transformers itself (sharded, untied head, Llama-3.1 rope scaling) give
transformers' logits, whole and at TP = 2; unsupported configs are refused in one line; exports round-trip and the
non-Llama layouts do not pass for a Llama; a real pretrained model, SmolLM2-135M-Instruct, answers as it should.
Starting a run from saved weights: tests/test_loading_init_from.py; crafted folders: tests/test_loading_crafted.py."""

import json

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks

import ladder_train.hf
from ladder_train import load_model
from ladder_train.errors import InputError
from ladder_train.folders import folder_kind, run_config_path
from ladder_train.inference import Generator
from ladder_train.loading import load_tp_shard
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import INDEX_FILE, LADDER_MODEL_TYPE, save_export

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


def _tp_worker(folder, out):
    dist.init_process_group("gloo")  # from run_ranks's environment
    rank, world = dist.get_rank(), dist.get_world_size()
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
    run_ranks(_tp_worker, 2, tmp_path / "hf", tmp_path)
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
    ladder_train.hf.register()
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
