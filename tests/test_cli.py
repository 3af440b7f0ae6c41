"""Every console script, fed bad input: exit 2 and one line, ``PROG: error: ...``, naming the culprit, before any
work. The table covers each script pyproject.toml installs, so a new command cannot slip past it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from cli_errors import ENTRIES, assert_bad_input
from dist_utils import save_training_checkpoint

import ladder_train.cli as cli
from ladder_train.data import byte_tokenizer
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    model = Transformer(ModelArgs(vocab_size=257, dim=32, n_layers=2, n_heads=4, ffn_dim=64, max_seq_len=64))
    folder = save_export(model, root / "model")
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    checkpoint = save_training_checkpoint(model, root / "run")
    (root / "file.txt").write_text("not a folder\n")
    (root / "not_a_run").mkdir()
    return {"model": folder, "checkpoint": checkpoint, "file": root / "file.txt", "root": root}


# (console script, argv with {placeholders}, what the one line must name)
BAD_INPUT = [
    ("ladder-train", ["--config", "{root}/missing.yaml"], "recipe not found: {root}/missing.yaml"),
    ("ladder-train", ["--config", SMOKE, "train.max_steps=0"], "key 'train.max_steps' must be at least 1"),
    ("ladder-train", ["--config", SMOKE, "model.n_heads=5"], "key 'model.n_heads'=5 does not divide model.dim=64"),
    ("ladder-train", ["--config", SMOKE, "--bogus"], "unrecognized arguments: --bogus"),
    ("ladder-train", ["show", "--config", SMOKE, "modle.dim=3"], "unknown key 'modle' (did you mean 'model'?)"),
    ("ladder-train", ["study", "--config", SMOKE, "run.dir=a,b"], "run.dir names the study's one folder"),
    ("ladder-train", ["demo", "--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    (
        "ladder-train",
        ["--config", SMOKE, "--dry-run", "--gpu-memory", "0"],
        "argument --gpu-memory: expected a finite number > 0, got '0'",
    ),
    ("ladder-bench", ["--tp", "0"], "argument --tp: expected an integer >= 1, got '0'"),
    ("ladder-bench", ["--tp", "-2"], "argument --tp: expected an integer >= 1, got '-2'"),
    ("ladder-bench", ["--model", "{root}/nowhere", "--tp", "1"], "{root}/nowhere"),
    (
        "ladder-bench",
        ["--model", "tiny", "--batch-sizes", "0", "--tp", "1"],
        "--batch-sizes must list positive integers",
    ),
    ("ladder-eval", ["{root}/nowhere"], "{root}/nowhere"),
    ("ladder-eval", ["{model}", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1, got '0'"),
    (
        "ladder-eval",
        ["{model}", "--device", "cuda:7", "--tasks", "arc_easy_local"],
        "--device cuda:7: no such CUDA device",
    ),
    ("ladder-export", ["{checkpoint}", "{checkpoint}"], "is inside the source"),
    ("ladder-export", ["{checkpoint}", "{checkpoint}/export"], "is inside the source"),
    ("ladder-export", ["{model}", "{root}/out", "--license", "Apache 2.0"], "is not a Hub licence identifier"),
    ("ladder-export", ["{checkpoint}", "{file}"], "{file} exists and is not a folder"),
    ("ladder-export", ["{root}/nowhere", "{root}/out"], "{root}/nowhere"),
    ("ladder-report", ["--out", "{root}/report"], "give run folders, --bench files, or both"),
    ("ladder-report", ["{root}/not_a_run", "--out", "{root}/report"], "{root}/not_a_run: not a run folder"),
    ("ladder-report", ["{root}/not_a_run", "--out", "{file}"], "{file} exists and is not a folder"),
    ("ladder-predict", ["--model", "nope"], "nope"),
    ("ladder-predict", ["--gpu", "tpu"], "tpu"),
    ("ladder-predict", ["--prompt-len", "0"], "argument --prompt-len: expected an integer >= 1, got '0'"),
    ("ladder-predict", ["paper", "--gpu", "tpu"], "--gpu 'tpu': no such profile"),
    (
        "ladder-predict",
        ["calibrate", "--out", "{root}/cpu.yaml", "--reps", "0"],
        "argument --reps: expected an integer >= 1",
    ),
    (
        "ladder-generate",
        ["{model}", "--prompt", "x", "--temperature", "nan"],
        "--temperature must be 0 (greedy) or positive",
    ),
    (
        "ladder-generate",
        ["{model}", "--prompt", "x", "--top-k", "0"],
        "argument --top-k: expected an integer >= 1, got '0'",
    ),
    ("ladder-generate", ["{model}", "--prompt", "caf\udce9"], "argument --prompt: is not valid UTF-8 text"),
    ("ladder-generate", ["{root}/nowhere", "--prompt", "x"], "{root}/nowhere"),
    (
        "ladder-train",
        ["--config", SMOKE, "data.source=null", "data.sources=[{{path: {root}, weight: 0}}]"],
        "key 'data.sources[0].weight' must be a finite number > 0, got 0.0",
    ),
    (
        "ladder-train",
        ["--config", SMOKE, "data.sources=[{{path: {root}}}]"],
        "keys 'data.source' and 'data.sources' are both set (data.source=python-stdlib)",
    ),
    (
        "ladder-data",
        ["prepare", "{root}/nowhere", "{root}/tokens", "--tokenizer", "byte"],
        "no such file or folder: {root}/nowhere",
    ),
    (
        "ladder-data",
        ["prepare", "python-stdlib", "{root}/tokens", "--tokenizer", "byte", "--workers", "0"],
        "argument --workers: expected an integer >= 1, got '0'",
    ),
    ("ladder-data", ["prepare", "python-stdlib", "{file}", "--tokenizer", "byte"], "{file} exists and is not a folder"),
    (
        "ladder-data",
        ["prepare", "python-stdlib", "{root}/tokens", "--tokenizer", "{root}/missing.json"],
        "--tokenizer: no such file: {root}/missing.json",
    ),
    ("ladder-data", ["info", "{root}/not_a_run"], "{root}/not_a_run: no ladder_tokens.json"),
]


def test_the_table_covers_every_installed_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(ENTRIES) == {prog for prog, _, _ in BAD_INPUT}
    for prog, target in scripts.items():
        assert getattr(cli, target.split(":")[1]) is ENTRIES[prog]


@pytest.mark.parametrize("prog, argv, named", BAD_INPUT, ids=[f"{p} {' '.join(a)}"[:60] for p, a, _ in BAD_INPUT])
def test_bad_input_is_exit_2_and_one_line_naming_it(inputs, capsys, monkeypatch, prog, argv, named):
    fill = {key: str(value) for key, value in inputs.items()}
    assert_bad_input(prog, [arg.format(**fill) for arg in argv], named.format(**fill), capsys, monkeypatch)


@pytest.mark.parametrize("code, name", [("ENOSPC", "No space left on device"), ("EFBIG", "File too large")])
def test_a_full_disk_or_a_file_at_its_size_limit_is_exit_1_and_one_line(capsys, code, name):
    import errno

    def write(argv):
        raise OSError(getattr(errno, code), name, "/runs/a/metrics.jsonl")

    assert cli.run_command("ladder-x", write, []) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ladder-x: error: /runs/a/metrics.jsonl: {name} (") and err.count("\n") == 1


def test_ctrl_c_while_a_command_imports_is_exit_130_and_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "slow_to_import.py").write_text("raise KeyboardInterrupt\n")  # Ctrl-C while its imports load
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = cli._module_command("ladder-x", "slow_to_import")
    assert entry([]) == 130
    assert capsys.readouterr().err == "ladder-x: interrupted (Ctrl-C)\n"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["ladder-train", "show", "--config", SMOKE], ["ladder-data", "info", "."]])
def test_ctrl_c_in_the_first_seconds_of_a_console_script_is_exit_130_and_one_line(argv):
    """SIGINT once torch's import has begun (``-X importtime`` reports each import as it ends)."""
    import functools
    import os
    import re
    import signal
    import subprocess
    import sys

    script = str(Path(sys.executable).parent / argv[0])
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    # Ctrl-C's default action even when this test runs in a background job (which starts with SIGINT ignored)
    default_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    proc = subprocess.Popen(
        [script, *argv[1:]], stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, preexec_fn=default_sigint
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if re.search(r"\|\s+torch\b", line):  # the first of torch's modules loaded: torch is importing
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=120) == 130
    said = [line for line in lines if not line.startswith("import time:") and line.strip()]
    assert said == [f"{argv[0]}: interrupted (Ctrl-C)\n"], "".join(said)[-2000:]
