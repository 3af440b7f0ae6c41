"""A desync model in transformers (ladder_train/hf, issue 43): its export's config.json holds the desync fields and
reads back to the same ModelArgs; AutoModelForCausalLM emulates the t rank-local streams as ladder-train does, so a
briefly trained desync model gives ladder-train's logits (2x and 4x patterns, a hybrid, an explicit pattern, t = 4
above 2 KV heads, whose cache holds one head per stream) and greedy tokens, from the folder's own code too."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from test_hf import PROMPT, TINY, hf_greedy, ladder_greedy, relative_error

from ladder_train.export import export_folder
from ladder_train.hf import register
from ladder_train.hf.modeling_ladder_llama import CACHE
from ladder_train.loading import load_model, load_tp_shard
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export


@pytest.fixture(autouse=True, scope="module")
def _ladder_llama_registered():
    register()


CASES = {
    "2x, t=2": dict(desync_tp=2),
    "4x, t=2": dict(desync_tp=2, desync_reduce_every=4),
    "hybrid: 2 standard + 2 desync": dict(desync_tp=2, desync_layers=2),
    "explicit pattern, t=2": dict(desync_tp=2, desync_pattern=["none", "attention", "both", "mlp"]),
    "t=4 above 2 kv heads": dict(desync_tp=4),
}


def trained(fields: dict) -> Transformer:
    """A tiny desync model after 3 AdamW steps on a random batch: weights away from their init (init_std 0.1, so
    greedy tokens vary instead of repeating one token) and norms away from ones."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**{**TINY, "init_std": 0.1, "residual": "desync", **fields}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randint(0, TINY["vocab_size"], (4, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_the_export_config_holds_the_desync_fields_and_reads_back_exactly(tmp_path):
    model = trained(CASES["explicit pattern, t=2"] | {"desync_layers": 4, "desync_reduce_every": 3})
    config = json.loads((save_export(model, tmp_path / "desync") / "config.json").read_text())
    assert config["model_type"] == "ladder_llama" and config["residual"] == "desync"
    assert {k: v for k, v in config.items() if k.startswith("desync")} == {
        "desync_tp": 2,
        "desync_reduce_every": 3,
        "desync_pattern": ["none", "attention", "both", "mlp"],
        "desync_layers": 4,
    }
    assert load_model(tmp_path / "desync").args == model.args
    assert load_tp_shard(tmp_path / "desync", tp_rank=1, tp_size=2).args == model.args  # TP inference's reading
    # other layouts' configs carry no desync key, and one without them still reads (an export from before desync)
    ladder = ModelArgs(**TINY, residual="ladder")
    config = json.loads((save_export(Transformer(ladder), tmp_path / "ladder") / "config.json").read_text())
    assert not [k for k in config if k.startswith("desync")]
    assert load_model(tmp_path / "ladder").args == ladder


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_auto_model_emulates_the_streams_and_gives_ladder_train_logits(fields, tmp_path):
    model = trained(fields)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(save_export(model, tmp_path / "export")).eval()
    assert type(hf_model).__name__ == "LadderLlamaForCausalLM"
    assert hf_model.config.layer_reduces() == model.args.layer_reduces()
    standard = Transformer(ModelArgs(**{**TINY, "init_std": 0.1})).eval()
    standard.load_state_dict(model.state_dict())
    with torch.no_grad():
        ours = model(PROMPT)
        assert relative_error(ours, hf_model(PROMPT).logits) < 1e-5
        assert relative_error(ours, standard(PROMPT)) > 1e-2  # the same weights as a Llama: another function


def test_greedy_tokens_through_transformers_cache_with_a_head_per_stream(tmp_path):
    """t = 4 above 2 KV heads: each emulated rank holds its own copy of a KV head, so every cache holds 4 heads."""
    model = trained(CASES["t=4 above 2 kv heads"])
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(save_export(model, tmp_path / "export")).eval()
    with torch.no_grad():
        cache = getattr(hf_model(PROMPT, use_cache=True), CACHE)
    assert [layer.keys.shape[1] for layer in cache.layers] == [4] * TINY["n_layers"]
    hf_model.generation_config.eos_token_id = None  # all 24 tokens on both sides
    ours = ladder_greedy(model, PROMPT, 24)
    assert len(set(ours[0].tolist())) > 8  # tokens that depend on the context, not one repeated
    assert torch.equal(hf_greedy(hf_model, PROMPT, 24), ours)
    static = hf_model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=24,
        do_sample=False,
        cache_implementation="static",
    )
    assert torch.equal(static[:, PROMPT.shape[1] :], ours)


@pytest.mark.slow
def test_a_desync_export_folder_loads_with_trust_remote_code_where_ladder_train_cannot_be_imported(tmp_path):
    """ladder-export's writer (a card, the classes beside the weights); the folder's own code, without ladder-train,
    gives ladder-train's logits for a hybrid and greedy tokens for t = 4 above 2 KV heads."""
    models = {name: trained(CASES[name]) for name in ("hybrid: 2 standard + 2 desync", "t=4 above 2 kv heads")}
    folders = []
    for i, model in enumerate(models.values()):
        staged = save_export(model, tmp_path / f"staged{i}")
        folders.append(str(export_folder(staged, tmp_path / f"export{i}")))
    card = (tmp_path / "export0" / "README.md").read_text()
    assert "the last 2 of 4 layers desync, the first 2 standard; 2 rank-local residual streams" in card
    assert "re-synchronised by 2 of the desync layers' 4 modules" in card  # 2x: each MLP
    script = (
        "import sys, json, torch\n"
        "sys.modules['ladder_train'] = None  # importing ladder_train now raises ImportError\n"
        "from transformers import AutoModelForCausalLM\n"
        "prompt = torch.tensor(json.loads(sys.argv[3]))\n"
        "hybrid, wide = (AutoModelForCausalLM.from_pretrained(f, trust_remote_code=True).eval() for f in sys.argv[1:3])\n"
        "wide.generation_config.eos_token_id = None\n"
        "with torch.no_grad():\n"
        "    logits = hybrid(prompt).logits\n"
        "tokens = wide.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)\n"
        "torch.save((logits, tokens[:, prompt.shape[1]:]), sys.argv[4])\n"
        "print(type(hybrid).__module__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    out = subprocess.run(
        [sys.executable, "-c", script, *folders, json.dumps(PROMPT.tolist()), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1].startswith("transformers_modules.")  # the folder's own code ran
    logits, tokens = torch.load(tmp_path / "out.pt")
    hybrid, wide = models.values()
    with torch.no_grad():
        assert relative_error(hybrid(PROMPT), logits) < 1e-5
    assert torch.equal(tokens, ladder_greedy(wide, PROMPT, 24))
