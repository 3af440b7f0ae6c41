"""The vLLM plugin's parts that need no vLLM: pyproject.toml names the entry point, the package imports (and trains)
with vLLM absent and imports it nowhere but ladder_train/serve, each export's layers are read as its layout says,
and a bad export is refused in one line by the check vLLM runs before its engine starts (tests/test_serve.py runs
that check inside vLLM)."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from ladder_train.errors import InputError
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export

ROOT = Path(__file__).parents[1]


def test_pyproject_names_the_plugin_and_the_serve_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"ladder_train": "ladder_train.serve:register"}
    assert any(req.startswith("vllm") for req in project["optional-dependencies"]["serve"])


@pytest.mark.slow
def test_the_package_imports_without_vllm():
    blocked = (
        "import sys; sys.modules['vllm'] = None; import ladder_train, ladder_train.serve, ladder_train.serve.layouts"
    )
    subprocess.run([sys.executable, "-c", blocked + ", ladder_train.train, ladder_train.inference"], check=True)


def test_only_ladder_train_serve_imports_vllm():
    importers = []
    for file in (ROOT / "ladder_train").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                importers.append(file.relative_to(ROOT).parent.as_posix())
    assert importers and set(importers) == {"ladder_train/serve"}


SHAPE = dict(vocab_size=64, dim=64, n_layers=4, n_heads=2, n_kv_heads=2, ffn_dim=128, max_seq_len=32)


def hf_config(tmp_path: Path, name: str, **fields):
    from transformers import AutoConfig

    from ladder_train.hf import register

    register()
    torch.manual_seed(0)
    path = save_export(Transformer(ModelArgs(**SHAPE, **fields)), tmp_path / name)
    return path, AutoConfig.from_pretrained(path)


def test_each_layer_is_served_as_its_layout_says(tmp_path):
    from ladder_train.serve.layouts import layer_plan

    both = (True, True)
    _, hybrid = hf_config(tmp_path, "hybrid", residual="ladder", ladder_layers=1)
    assert layer_plan(hybrid) == [("standard", both)] * 3 + [("ladder", both)]
    _, parallel = hf_config(tmp_path, "parallel", residual="parallel")
    assert layer_plan(parallel) == [("parallel", both)] * 4
    _, desync = hf_config(tmp_path, "desync", residual="desync", desync_tp=2)  # each MLP reduces, the last always
    assert layer_plan(desync) == [("desync", (False, True))] * 4
    _, llama = hf_config(tmp_path, "standard", residual="standard")  # a plain LlamaConfig
    assert type(llama).__name__ == "LlamaConfig" and layer_plan(llama) == [("standard", both)] * 4


def test_a_bad_export_is_refused_in_one_line_before_vllm_starts(tmp_path):
    from ladder_train.serve.layouts import check_served_export

    path, desync = hf_config(tmp_path, "desync", residual="desync", desync_tp=2)
    check_served_export(str(path), 2, 1, desync)  # its own degree: served
    with pytest.raises(InputError, match=r"built for tensor-parallel degree 2 .* --tensor-parallel-size 2, not 4$"):
        check_served_export(str(path), 4, 1, desync)
    path, ladder = hf_config(tmp_path, "ladder", residual="ladder")
    with pytest.raises(InputError, match=r"pipeline parallelism is not supported .* \(got 2 stages\)$"):
        check_served_export(str(path), 1, 2, ladder)
    with pytest.raises(InputError, match=r"tensor-parallel degree 4 does not divide n_heads=2$"):
        check_served_export(str(path), 4, 1, ladder)
    (path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError, match=r"model.safetensors: not a readable safetensors file"):
        check_served_export(str(path), 1, 1, ladder)
    from ladder_train.serve.layouts import overlap_enabled

    assert overlap_enabled(ladder) is False  # held only when asked: no measurement has it paying yet
    ladder.ladder_overlap = True
    assert overlap_enabled(ladder) is True
    ladder.ladder_overlap = "no"
    with pytest.raises(InputError, match=r"^ladder_overlap='no': must be true or false$"):
        check_served_export(str(path), 1, 1, ladder)


SERVE_BENCH_REFUSALS = [
    (["--gen-len", "1"], "--gen-len must be at least 2"),
    (["--tp", "0"], "argument --tp: expected an integer >= 1, got '0'"),
    ([], "name export folders, or --preset NAME --work DIR"),
    (["--preset", "tiny"], "--preset tiny needs --work DIR"),
    (["--preset", "nope", "--work", "{tmp}"], "unknown model preset 'nope'"),
    (["--preset", "tiny", "--work", "{tmp}", "--set", "dim=0"], "--preset tiny: dim=0: must be a positive integer"),
    (["--preset", "tiny", "--work", "{tmp}", "--set", "width=3"], "--set 'width=3': expected FIELD=VALUE"),
    (["{tmp}", "--set", "dim=64"], "--set changes a --preset's shape"),
]


@pytest.mark.parametrize(
    "argv, named", SERVE_BENCH_REFUSALS, ids=[" ".join(a) or "nothing" for a, _ in SERVE_BENCH_REFUSALS]
)
def test_the_vllm_tpot_benchmark_refuses_bad_flags_in_one_line_before_vllm(tmp_path, capsys, monkeypatch, argv, named):
    import ladder_train.cli as cli

    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vLLM before the refusal would fail here

    out = tmp_path / "rows.jsonl"
    try:
        status = cli.vllm_tpot([arg.format(tmp=tmp_path) for arg in argv] + ["--out", str(out)])
    except SystemExit as exited:  # argparse's usage errors
        status = exited.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1, err
    assert lines[0].startswith("python -m ladder_train.serve: error: ") and named in lines[0], err
    assert not out.exists()
