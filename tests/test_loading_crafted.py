"""Crafted and ill-formed model folders and training checkpoints: refused in one line (exit 2 from the commands)
before any weight is read or any model is built, whole and at TP = 2."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_loading import LLAMA31_SCALING

from ladder_train import load_model
from ladder_train.errors import InputError
from ladder_train.loading import load_tp_shard
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import INDEX_FILE, save_export

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

    from ladder_train.checkpoint.integrity import write_manifest
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
