"""ladder-train models in transformers (ladder_train/hf): every layout's export loads with AutoModelForCausalLM
(registered by ladder_train.hf.register(), or from the folder's own files with trust_remote_code) and computes
ladder-train's logits and greedy tokens; exports carry a model card, generation_config.json and their tokenizer;
lm-eval's hf backend scores them as ladder-eval does."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
import yaml
from dist_utils import run_ranks

from ladder_train.cli import ladder_export
from ladder_train.config import load_config, save_config
from ladder_train.data import byte_tokenizer
from ladder_train.errors import InputError
from ladder_train.export import export_checkpoint
from ladder_train.hf import AUTO_MAP, MODEL_FILES, register
from ladder_train.inference.generate import Generator
from ladder_train.loading import load_model, model_from_checkpoint
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export


@pytest.fixture(autouse=True, scope="module")
def _ladder_llama_registered():
    register()  # AutoModelForCausalLM.from_pretrained(export) without the folder's code


TINY = dict(vocab_size=257, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=96, max_seq_len=64)
LAYOUTS = {
    "standard": dict(residual="standard"),
    "parallel": dict(residual="parallel", tie_embeddings=False),
    "ladder": dict(residual="ladder"),
    "hybrid": dict(residual="ladder", ladder_layers=2),
}
PROMPT = torch.randint(0, 257, (2, 7), generator=torch.Generator().manual_seed(3))


def tiny(layout: str, seed: int = 0, **shape) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(**{**TINY, **shape, **LAYOUTS[layout]})).eval()


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / a.abs().max()).item()


def ladder_greedy(model: Transformer, prompt: torch.Tensor, n: int, stop=None) -> torch.Tensor:
    model.clear_kv_cache()
    return Generator(model).generate(prompt, n, stop_tokens=stop)


def hf_greedy(hf_model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    out = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False)
    return out[:, prompt.shape[1] :]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_auto_model_gives_ladder_train_logits_and_greedy_tokens(layout, tmp_path):
    model = tiny(layout)
    export = save_export(model, tmp_path / layout)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    expected_class = "LlamaForCausalLM" if layout == "standard" else "LadderLlamaForCausalLM"
    assert type(hf_model).__name__ == expected_class
    with torch.no_grad():
        assert relative_error(model(PROMPT), hf_model(PROMPT).logits) < 1e-5
    # no stop token: both produce all 32 tokens (the cache path of generate(), batch of 2)
    hf_model.generation_config.eos_token_id = None
    assert torch.equal(hf_greedy(hf_model, PROMPT, 32), ladder_greedy(model, PROMPT, 32))


def test_layouts_differ_so_the_comparison_can_fail(tmp_path):
    """The same weights under another layout give other logits: the class really follows config.json's layout."""
    ladder = tiny("ladder")
    export = save_export(ladder, tmp_path / "ladder")
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "ladder_layers": 2}))
    hybrid = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    with torch.no_grad():
        assert relative_error(ladder(PROMPT), hybrid(PROMPT).logits) > 1e-2


def test_parallel_and_ladder_exports_carry_their_classes_and_auto_map(tmp_path):
    standard = save_export(tiny("standard"), tmp_path / "standard")
    ladder = save_export(tiny("ladder"), tmp_path / "ladder")
    assert "auto_map" not in json.loads((standard / "config.json").read_text())
    assert not any((standard / name).exists() for name in MODEL_FILES)
    config = json.loads((ladder / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP and config["model_type"] == "ladder_llama"
    for name in MODEL_FILES:  # the written files import only torch and transformers (and each other)
        source = (ladder / name).read_text()
        imports = {
            line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
        }
        assert imports <= {"torch", "transformers", ""}, (name, imports)


def test_bad_layout_fields_are_refused_by_the_config_class():
    from ladder_train.hf.configuration_ladder_llama import LadderLlamaConfig

    with pytest.raises(ValueError, match="residual='diagonal'"):
        LadderLlamaConfig(residual="diagonal")
    with pytest.raises(ValueError, match="ladder_layers=3"):
        LadderLlamaConfig(residual="parallel", ladder_layers=3)
    with pytest.raises(ValueError, match="rms_norm_eps=-1.0: must be a positive number"):
        LadderLlamaConfig(rms_norm_eps=-1.0)
    assert LadderLlamaConfig(num_hidden_layers=3, ladder_layers=1).layer_layouts() == ["standard"] * 2 + ["ladder"]
    with pytest.raises(ValueError, match=r"^desync_tp=3: does not divide num_attention_heads=32$"):
        LadderLlamaConfig(residual="desync", desync_tp=3)
    hybrid = LadderLlamaConfig(
        num_hidden_layers=3, residual="desync", desync_tp=2, desync_layers=2, desync_reduce_every=4
    )
    assert hybrid.layer_layouts() == ["standard", "desync", "desync"]
    assert hybrid.layer_reduces() == [(True, True), (False, False), (False, True)]  # 4x: every other MLP, the last


def test_transformers_tensor_parallel_plan_leaves_a_desync_model_whole():
    """transformers' TP would slice the heads a desync model already splits into its t streams: nothing is in its
    plan (replicated, the same function), the head neither: sharded, it would split the Parameter it shares with
    the embedding the plan leaves whole; a ladder keeps Llama's plan."""
    from ladder_train.hf.configuration_ladder_llama import LadderLlamaConfig
    from ladder_train.hf.modeling_ladder_llama import LadderLlamaForCausalLM

    shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    desync = LadderLlamaForCausalLM(
        LadderLlamaConfig(**shape, num_key_value_heads=2, residual="desync", desync_tp=2, tie_word_embeddings=True)
    )
    ladder = LadderLlamaForCausalLM(LadderLlamaConfig(**shape, num_key_value_heads=2, residual="ladder"))
    assert desync.tp_plan == {} and desync.lm_head.weight is desync.model.embed_tokens.weight
    assert "model.layers.*.self_attn.q_proj" in ladder.tp_plan and ladder.config.base_model_tp_plan


def desync(**fields) -> dict:
    """A hybrid ladder's config.json changed into a desync model's (t = 2) with ``fields``."""
    return {"residual": "desync", "ladder_layers": None, "desync_tp": 2, **fields}


# config.json values ladder-train's loader refuses (model/shape_checks.py), each changed in a hybrid's export
BAD_CONFIG_VALUES = [
    {"rms_norm_eps": -1e-5},
    {"rms_norm_eps": float("nan")},
    {"rope_theta": 0},
    {"initializer_range": -0.02},
    {"ladder_layers": "2"},
    {"ladder_layers": 1.5},
    {"ladder_layers": True},
    {"ladder_layers": 5},
    {"ladder_layers": 2, "residual": "parallel"},
    {"residual": "diagonal"},
    {"num_hidden_layers": "4"},
    {"num_hidden_layers": 0},
    {"vocab_size": 2**24 + 1},
    {"num_attention_heads": 3},
    {"num_key_value_heads": 3},
    {"hidden_size": 60},  # a head dimension of 15: rotary embeddings rotate pairs
    {"tie_word_embeddings": "yes"},
    {"max_position_embeddings": 0},
    {"hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 2**23},  # a 2**35-element embedding
    {"desync_tp": 2},  # on a ladder
    {"desync_pattern": ["mlp"] * 4},
    desync(desync_tp=None),
    desync(desync_tp=1),
    desync(desync_tp=True),
    desync(desync_tp="2"),
    desync(desync_tp=3),  # does not divide 4 heads
    desync(desync_tp=4, intermediate_size=90),
    desync(hidden_size=96, num_attention_heads=6, num_key_value_heads=3),  # t = 2 splits 3 KV heads unevenly
    desync(desync_tp=4, num_key_value_heads=None, num_attention_heads=6, hidden_size=96),
    desync(desync_reduce_every=0),
    desync(desync_reduce_every=1.5),
    desync(desync_reduce_every=None),
    desync(desync_layers=5),
    desync(desync_layers=-1),
    desync(desync_layers="2"),
    desync(desync_pattern="mlp"),
    desync(desync_pattern=["mlp"]),
    desync(desync_layers=2, desync_pattern=["mlp", "all"]),
    desync(desync_pattern=["mlp", "none", None, "both"]),
]


@pytest.mark.parametrize("bad", BAD_CONFIG_VALUES, ids=json.dumps)
def test_the_class_refuses_what_ladder_train_refuses_in_the_same_words(bad, tmp_path):
    """The class an export carries cannot import ladder-train, so it repeats shape_checks: the same verdicts."""
    export = save_export(tiny("hybrid"), tmp_path / "export")
    config_path = export / "config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **bad}))
    with pytest.raises(InputError) as ours:
        load_model(export)
    with pytest.raises(ValueError) as theirs:
        transformers.AutoConfig.from_pretrained(export)
    assert str(ours.value) == f"{config_path}: {theirs.value}"


def test_a_negative_epsilon_is_refused_instead_of_giving_nan_logits(tmp_path):
    from ladder_train.hf import configuration_ladder_llama as theirs
    from ladder_train.model import shape_checks as ours

    limits = ("MAX_SIZE", "MAX_LAYERS", "MAX_TENSOR_ELEMENTS", "MAX_PARAMETERS")
    assert [getattr(theirs, name) for name in limits] == [getattr(ours, name) for name in limits]
    export = save_export(tiny("ladder"), tmp_path / "export")
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "rms_norm_eps": -1e-5}))
    with pytest.raises(ValueError, match=r"^rms_norm_eps=-1e-05: must be a positive number$"):
        transformers.AutoModelForCausalLM.from_pretrained(export)


@pytest.mark.slow
def test_the_export_loads_with_trust_remote_code_where_ladder_train_cannot_be_imported(tmp_path):
    model = tiny("hybrid")
    export = save_export(model, tmp_path / "export")
    script = (
        "import sys, json, torch\n"
        "sys.modules['ladder_train'] = None  # importing ladder_train now raises ImportError\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        "    AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "    print('loaded without trust_remote_code')\n"
        "except ValueError:\n"
        "    pass\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()\n"
        "with torch.no_grad():\n"
        "    logits = model(torch.tensor(json.loads(sys.argv[2]))).logits\n"
        "torch.save(logits, sys.argv[3])\n"
        "print(type(model).__module__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    out = subprocess.run(
        [sys.executable, "-c", script, str(export), json.dumps(PROMPT.tolist()), str(tmp_path / "logits.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loaded without trust_remote_code" not in out.stdout  # without the flag the folder's code does not run
    assert out.stdout.split()[-1].startswith("transformers_modules.")  # the folder's own code ran
    with torch.no_grad():
        assert relative_error(model(PROMPT), torch.load(tmp_path / "logits.pt")) < 1e-5


@pytest.mark.slow
def test_register_makes_auto_classes_read_ladder_llama_and_importing_ladder_train_changes_nothing():
    script = (
        "import sys\n"
        "finders = list(sys.meta_path)\n"
        "import ladder_train, ladder_train.hf\n"
        "assert 'transformers' not in sys.modules, 'ladder_train imported transformers itself'\n"
        "assert sys.meta_path == finders, 'importing ladder_train changed the import machinery'\n"
        "from transformers import AutoConfig\n"
        "try:\n"
        "    AutoConfig.for_model('ladder_llama')\n"
        "    print('known before register()')\n"
        "except ValueError:\n"
        "    pass\n"
        "ladder_train.hf.register()\n"
        "print(type(AutoConfig.for_model('ladder_llama', num_hidden_layers=2)).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["LadderLlamaConfig"]


# the real pretrained model: SmolLM2 converted to a 15-layer hybrid ---------------------------------------------

SMOLLM2_PROMPT = torch.tensor([[504, 3575, 282, 4649, 314, 7042, 30, 378, 3575, 282, 7042, 314]])


@pytest.mark.slow
def test_smollm2_as_a_15_layer_hybrid_in_transformers(smollm2, tmp_path):
    source = load_model(smollm2)
    model = Transformer(dataclasses.replace(source.args, residual="ladder", ladder_layers=15)).eval()
    model.load_state_dict(source.state_dict())  # the conversion, before any retraining
    export = save_export(model, tmp_path / "hybrid", token_ids={"bos_token_id": 1, "eos_token_id": 2})
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    assert hf_model.config.layer_layouts() == ["standard"] * 15 + ["ladder"] * 15
    with torch.no_grad():
        assert relative_error(model(SMOLLM2_PROMPT), hf_model(SMOLLM2_PROMPT).logits) < 1e-5
    hf_model.generation_config.eos_token_id = None  # all 32 tokens on both sides
    assert torch.equal(hf_greedy(hf_model, SMOLLM2_PROMPT, 32), ladder_greedy(model, SMOLLM2_PROMPT, 32))


@pytest.mark.slow
def test_a_hub_ready_folder_from_an_hf_source_keeps_its_tokens_licence_and_eos(smollm2, tmp_path):
    (smollm2 / "README.md").write_text("---\nlicense: apache-2.0\n---\n# SmolLM2\n")
    try:
        assert ladder_export([str(smollm2), str(tmp_path / "out"), "--dtype", "bf16"]) == 0
    finally:
        (smollm2 / "README.md").unlink()
    out = tmp_path / "out"
    meta = yaml.safe_load((out / "README.md").read_text().split("---")[1])
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)  # <|im_start|>, <|im_end|>
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    answer = hf_model.generate(**prompt, max_new_tokens=12, do_sample=False)[0, prompt["input_ids"].shape[1] :]
    assert "Paris" in tokenizer.decode(answer) and answer[-1].item() == 2  # stopped at its eos, as ladder-generate


@pytest.mark.slow
def test_ladder_eval_scores_a_smollm2_hybrid_export_as_lm_eval_hf_does(smollm2, shared_dir, tmp_path, capsys):
    """SmolLM2-Instruct's eos is its chat end <|im_end|> = 2, its document separator <|endoftext|> = 0: ladder-eval
    scores the export all the same, with lm-eval hf's accuracy, and still refuses a tokenizer of another model."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from ladder_train.cli import ladder_eval
    from ladder_train.data import load_tokenizer
    from ladder_train.evaluation.adapter import LadderLM
    from ladder_train.evaluation.harness import _simple_evaluate
    from ladder_train.evaluation.results import summarize

    source = load_model(smollm2)
    hybrid = Transformer(dataclasses.replace(source.args, residual="ladder", ladder_layers=15)).eval()
    hybrid.load_state_dict(source.state_dict())
    staged = save_export(hybrid, tmp_path / "staged", torch.bfloat16)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (staged / name).write_bytes((smollm2 / name).read_bytes())
    export = tmp_path / "export"
    assert ladder_export([str(staged), str(export), "--dtype", "bf16"]) == 0
    assert json.loads((export / "config.json").read_text())["eos_token_id"] == 2

    task, limit, local = "arc_easy_local", 6, str(shared_dir / "eval")
    argv = [str(export), "--tasks", task, "--local-data", local, "--limit", str(limit), "--device", "cpu"]
    assert ladder_eval([*argv, "--out", str(tmp_path / "ours.json")]) == 0
    ours = json.loads((tmp_path / "ours.json").read_text())["summary"][task]
    hf = HFLM(pretrained=str(export), dtype="float32", device="cpu", batch_size=8)
    assert type(hf.model).__name__ == "LadderLlamaForCausalLM" and hf.eot_token_id == 2
    theirs = summarize(_simple_evaluate(hf, [task], None, local, limit, 0)["results"])[task]
    assert (ours["acc"], ours["acc_norm"]) == (theirs["acc"], theirs["acc_norm"])
    # beneath the accuracy: the same log-likelihood of each (context, continuation)
    pairs = [("The capital of France is", " Paris"), ("Water boils at", " 100 degrees"), ("A ladder has", " rungs")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    ladder_lm = LadderLM(load_model(export), load_tokenizer(str(export / "tokenizer.json")))
    for (ours_ll, ours_greedy), (their_ll, their_greedy) in zip(
        ladder_lm.loglikelihood(requests), hf.loglikelihood(requests), strict=True
    ):
        assert ours_ll == pytest.approx(their_ll, rel=1e-4) and ours_greedy == their_greedy

    starcoder = str(shared_dir / "tokenizers" / "starcoder" / "tokenizer.json")  # the same 49,152 entries
    capsys.readouterr()
    assert ladder_eval([*argv, "--tokenizer", starcoder]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "'<|im_end|>'" in line and "tokenizer mismatch" in line


# a training checkpoint's export: card, generation config, tokenizer, and a round trip through a hybrid run ------


def _adapt_worker(folder: str, run_dir: str, batches: list):
    import torch.distributed as dist

    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        overrides = [f"model.{k}={v}" for k, v in TINY.items()] + [
            "model.residual=ladder",
            "model.ladder_layers=2",
            f"checkpoint.init_from={folder}",
            f"data.tokenizer={folder}/tokenizer.json",
            "data.seq_len=16",
            f"run.dir={run_dir}",
            "train.global_batch_size=2",
            "train.micro_batch_size=2",
            "train.schedule.warmup_steps=1",
            "train.schedule.total_steps=2",
            "train.optimizer.lr=1e-2",
            "wandb.mode=disabled",
            "eval.at_end=false",
        ]
        Trainer(load_config(None, overrides), env, batches=batches).train()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_round_trip_hf_folder_to_a_hybrid_run_to_export_to_transformers(tmp_path):
    """An HF folder -> a ladder-train hybrid run from it (checkpoint.init_from) -> ladder-export -> transformers."""
    source = save_export(tiny("standard"), tmp_path / "source")
    byte_tokenizer().save(str(source / "tokenizer.json"))
    ids = torch.randint(0, 257, (2, 17), generator=torch.Generator().manual_seed(5))
    batches = [(ids[:, :-1], ids[:, 1:])] * 2
    run_ranks(_adapt_worker, 1, str(source), str(tmp_path / "run"), batches)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-2"
    export = export_checkpoint(checkpoint, tmp_path / "export", license="mit")
    trained = model_from_checkpoint(checkpoint).eval()
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    assert hf_model.config.layer_layouts() == ["standard", "standard", "ladder", "ladder"]
    with torch.no_grad():
        assert relative_error(trained(PROMPT), hf_model(PROMPT).logits) < 1e-5
        start = tiny("standard")(PROMPT)
        assert relative_error(start, trained(PROMPT)) > 1e-3  # it did train: the export is not the source
    card = (export / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["license"] == "mit" and "ladder-residual" in meta["tags"]
    assert "hybrid ladder: the last 2 of 4 layers ladder" in card and "64 in 2 steps" in card  # 2 steps x 2 x 16 tokens
    assert str(source) in card  # initialised from
    eos = byte_tokenizer().token_to_id("<|endoftext|>")
    assert json.loads((export / "generation_config.json").read_text())["eos_token_id"] == eos


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_the_card_lists_the_runs_eval_results_for_the_exported_step(tmp_path):
    from ladder_train.checkpoint import Checkpointer

    model = tiny("ladder")
    cfg = load_config(None, ["data.tokenizer=byte", f"run.dir={tmp_path / 'run'}"])
    checkpointer = Checkpointer(cfg.checkpoint, tmp_path / "run", rank=0, world_size=1)
    state = {"step": 7, "tokens_seen": 4096, "model_args": dataclasses.asdict(model.args)}
    step = checkpointer.save(7, model, torch.optim.AdamW(model.parameters()), state, {})
    save_config(cfg, tmp_path / "run" / "config.yaml")
    record = {"summary": {"piqa_local": {"acc": 0.5625, "acc_norm": 0.5}}, "limit": 16}
    (tmp_path / "run" / "eval").mkdir()
    (tmp_path / "run" / "eval" / "step-7.json").write_text(json.dumps(record))
    export = export_checkpoint(step, tmp_path / "export")
    card = (export / "README.md").read_text()
    assert "| piqa_local | acc | 0.5625 |" in card and "the first 16 rows" in card
    assert "4,096 in 7 steps" in card and "`other` (not stated" in card
    assert json.loads((export / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"


# lm-eval's hf backend against ladder-eval --------------------------------------------------------------------


@pytest.mark.slow
def test_lm_eval_hf_backend_agrees_with_ladder_eval_on_a_ladder_export(shared_dir, tmp_path):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from ladder_train.data import load_tokenizer
    from ladder_train.evaluation import evaluate
    from ladder_train.evaluation.adapter import LadderLM
    from ladder_train.evaluation.harness import _simple_evaluate
    from ladder_train.evaluation.results import summarize

    tokenizer_file = shared_dir / "tokenizers" / "starcoder" / "tokenizer.json"
    model = tiny("ladder", vocab_size=49152, dim=32, n_heads=4, n_kv_heads=4, ffn_dim=64, max_seq_len=256)
    export = save_export(model, tmp_path / "export")
    load_tokenizer(str(tokenizer_file)).save(str(export / "tokenizer.json"))
    (export / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    task = ["arc_easy_local"]
    ours = evaluate(
        model, load_tokenizer(str(tokenizer_file)), task, local_data=shared_dir / "eval", limit=24, print_table=False
    )
    hf = HFLM(pretrained=str(export), trust_remote_code=True, dtype="float32", device="cpu", batch_size=8)
    assert type(hf.model).__name__ == "LadderLlamaForCausalLM"
    theirs = summarize(_simple_evaluate(hf, task, None, shared_dir / "eval", 24, 0)["results"])
    assert ours["arc_easy_local"]["acc"] == pytest.approx(theirs["arc_easy_local"]["acc"], abs=1e-9)
    assert ours["arc_easy_local"]["acc_norm"] == pytest.approx(theirs["arc_easy_local"]["acc_norm"], abs=1e-9)
    # beneath the scores: the same log-likelihood for each (context, continuation) request
    pairs = [("The capital of France is", " Paris"), ("Water boils at", " 100 degrees"), ("A ladder has", " rungs")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    ladder_lm = LadderLM(model, load_tokenizer(str(tokenizer_file)))
    for (ours_ll, ours_greedy), (their_ll, their_greedy) in zip(
        ladder_lm.loglikelihood(requests), hf.loglikelihood(requests), strict=True
    ):
        assert ours_ll == pytest.approx(their_ll, rel=1e-5) and ours_greedy == their_greedy
