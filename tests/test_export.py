"""The Hugging Face export (ladder-export): a standard checkpoint exports to a folder transformers' Llama reads with
the same logits; a missing folder is one line."""

import json
import subprocess

import pytest
import torch
from dist_utils import run_ranks
from test_checkpoint import PYTHON, SEQ, VOCAB, train_synthetic


def console(entry: str) -> list[str]:
    """The command line of a console script (``ladder_train.cli.<entry>``) run by this interpreter."""
    return [PYTHON, "-c", f"import sys; from ladder_train.cli import {entry}; sys.exit({entry}())"]


@pytest.mark.slow
def test_standard_export_matches_llama_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    run_ranks(train_synthetic, 1, str(tmp_path / "run"), 0, 3, ["model.residual=standard", "model.n_kv_heads=2"])
    out = tmp_path / "export"
    result = subprocess.run(
        [*console("ladder_export"), str(tmp_path / "run" / "checkpoints" / "step-3"), str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["residual"] == "standard" and config["num_key_value_heads"] == 2

    from ladder_train import load_model

    ours = load_model(out).eval()
    llama = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(llama(ids).logits, ours(ids), atol=1e-5, rtol=1e-5)
    # and the checkpoint itself loads to the same model
    from_checkpoint = load_model(tmp_path / "run" / "checkpoints" / "step-3")
    with torch.no_grad():
        torch.testing.assert_close(from_checkpoint(ids), ours(ids), atol=0, rtol=0)


def test_export_of_a_missing_folder_says_so(tmp_path, export):
    result = export(tmp_path / "runs" / "x" / "checkpoints" / "step-9", tmp_path / "out")
    assert result.returncode == 2  # a path the user typed: bad input
    assert result.stderr.splitlines() == [
        f"ladder-export: error: {tmp_path / 'runs' / 'x' / 'checkpoints' / 'step-9'}: no such folder"
    ]
