"""benchmarks/peers.py and peer_runs.py: the peers' commands built from our recipe (shape equal, field by field),
their real output formats read into rows, ours / theirs from rows, transformers' decode end to end on the CPU."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_check as check
from benchmarks import gpu_plan as planning
from benchmarks import peer_runs as runs
from benchmarks import peers
from ladder_train.config import load_config, model_args
from ladder_train.model import PRESETS, count_params, flops_per_token, preset_args

REPO = Path(__file__).resolve().parent.parent


def gpu_plan(tmp_path, *extra):
    argv = ["--out", str(tmp_path), "--layouts", "standard", "--micro", "2,8", "--steps", "14", "--peers"]
    args = check.parse_args([*argv, "--decode-layers", "40", *extra])
    return planning.Plan(
        planning.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T", "data.tokenizer=/K.json"], args
    )


def test_torchtitan_builds_the_presets_shape_field_by_field():
    shape = runs.titan_model(preset_args("1.2B"))
    assert shape == {
        "dim": 1536,
        "n_layers": 40,
        "n_heads": 24,
        "n_kv_heads": 24,
        "vocab_size": 49152,
        "multiple_of": 1024,
        "ffn_dim_multiplier": None,
        "norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_seq_len": 2048,
        "rope_scaling_factor": 1.0,
    }
    assert runs.titan_ffn(1536, shape["multiple_of"], shape["ffn_dim_multiplier"]) == 4096 == PRESETS["1.2B"]["ffn_dim"]
    for name, preset in PRESETS.items():  # torchtitan's SwiGLU rule reaches every preset's width
        args = preset_args(name)
        width = runs.titan_width(args.dim, args.ffn_dim)
        assert runs.titan_ffn(args.dim, width["multiple_of"], width["ffn_dim_multiplier"]) == preset["ffn_dim"], name
    assert runs.titan_width(100, 300) == {"multiple_of": 1, "ffn_dim_multiplier": 300 / 266}  # needs the multiplier
    for layout in ("parallel", "ladder"):
        with pytest.raises(ValueError, match="standard layout"):
            runs.titan_model(preset_args("1.2B", residual=layout))


def test_torchtitan_model_is_ours_with_an_untied_head():
    llama3 = pytest.importorskip("torchtitan.models.llama3")  # where the wheels of gpu_prepare.sh are installed
    from torchtitan.models.llama3.model.args import RoPEScalingArgs

    ours = preset_args("1.2B")
    shape = runs.titan_model(ours)
    factor = shape.pop("rope_scaling_factor")
    args = llama3.TransformerModelArgs(**shape, rope_scaling_args=RoPEScalingArgs(scaling_factor=factor))
    with torch.device("meta"):
        model = llama3.Transformer(args)
    assert sum(p.numel() for p in model.parameters()) == count_params(ours)["total"] + ours.vocab_size * ours.dim
    assert args.get_nparams_and_flops(model, 2048)[1] == flops_per_token(ours, 2048)


def test_the_peers_commands_carry_the_training_rows_settings(tmp_path):
    _, measured, _ = planning.build_parts(gpu_plan(tmp_path))
    names = [p.name for p in measured]
    peer_names = ["titan-standard-mb2", "bare-standard-mb2", "titan-standard-mb8", "bare-standard-mb8", "hf-decode"]
    assert names == ["ceilings", "train-standard-mb2", "train-standard-mb8", *peer_names, "decode", "decode-gemv-off"]
    by_name = {p.name: p for p in measured}
    for micro in (2, 8):
        train = by_name[f"train-standard-mb{micro}"].argv
        for kind in ("titan", "bare"):
            part = by_name[f"{kind}-standard-mb{micro}"]
            assert part.argv[:5] == [sys.executable, "-m", "benchmarks.peer_runs", kind, "--config"]
            opts = runs.parse_args(part.argv[3:])
            assert opts.config == "recipes/standard_1b.yaml" == train[4]
            same = [x for x in train[5:] if not x.startswith("run.dir=")]
            assert [x for x in opts.overrides if not x.startswith("run.dir=")] == same
            cfg = load_config(opts.config, opts.overrides)
            assert model_args(cfg.model) == preset_args("1.2B")  # the shape each peer part builds from
            assert (cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.data.seq_len) == (micro, 16, 2048)
            assert (cfg.train.max_steps, cfg.parallel.compile, part.info["skip"]) == (14, True, 5)
    decode = runs.parse_args(by_name["hf-decode"].argv[3:])
    wanted = {"preset": "1.2B", "layers": 40, "prompt": 512, "new": 256, "warmup": 2, "runs": 5, "compile": True}
    assert {key: vars(decode)[key] for key in wanted} == wanted and decode.vocab is None
    # --tiny: no torchtitan (CUDA only), the tiny decode eager with the byte vocabulary; no decode part, no hf-decode
    args = check.parse_args(["--out", str(tmp_path), "--tiny", "--layouts", "standard", "--peers"])
    plan = planning.Plan(planning.TINY, tmp_path / "w", tmp_path / "l", ["data.source=python-stdlib"], args)
    tiny = {p.name: p for p in planning.build_parts(plan)[1] if p.kind in peers.KINDS}
    assert list(tiny) == ["bare-standard-mb2", "hf-decode"]
    decode = runs.parse_args(tiny["hf-decode"].argv[3:])
    assert (decode.preset, decode.layers, decode.vocab, decode.compile, decode.new) == ("tiny", 2, 257, False, 8)
    _, measured, _ = planning.build_parts(gpu_plan(tmp_path, "--decode-layers", "0"))
    assert "hf-decode" not in [p.name for p in measured]
    args = check.parse_args(["--out", str(tmp_path), "--layouts", "standard"])  # without --peers: none
    plan = planning.Plan(planning.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T"], args)
    assert not any(p.kind in peers.KINDS for p in planning.build_parts(plan)[1])


def test_torchtitan_flags_from_the_recipe():
    overrides = ["train.micro_batch_size=2", "train.global_batch_size=16", "train.max_steps=14"]
    cfg = load_config("recipes/standard_1b.yaml", [*overrides, "train.schedule.warmup_steps=5"])
    flags = runs.titan_flags(cfg, torch.bfloat16, "/dump")
    pairs = dict(zip(flags[:-4:2], flags[1:-4:2], strict=True))
    assert pairs == {
        "--model.name": runs.TITAN_SPEC,
        "--model.flavor": runs.TITAN_FLAVOR,
        "--training.local_batch_size": "2",
        "--training.global_batch_size": "16",
        "--training.seq_len": "2048",
        "--training.steps": "14",
        "--training.max_norm": "1.0",
        "--training.mixed_precision_param": "bfloat16",
        "--optimizer.lr": "0.0003",
        "--optimizer.beta1": "0.9",
        "--optimizer.beta2": "0.95",
        "--optimizer.eps": "1e-10",
        "--optimizer.weight_decay": "0.1",
        "--lr_scheduler.warmup_steps": "5",
        "--activation_checkpoint.mode": "none",
        "--metrics.log_freq": "1",
        "--job.dump_folder": "/dump",
    }
    assert flags[-4:] == ["--metrics.disable_color_printing", "--compile.enable", "--compile.components", "model,loss"]
    eager = load_config("recipes/standard_1b.yaml", [*overrides, "parallel.compile=false"])
    assert "--compile.enable" not in runs.titan_flags(eager, torch.float32, "/d")
    every_n = load_config("recipes/standard_1b.yaml", [*overrides, "parallel.activation_checkpoint=every_n"])
    with pytest.raises(ValueError, match="every_n"):
        runs.titan_flags(every_n, torch.bfloat16, "/d")


# torchtitan 0.2.2's log of a run of peer_runs' titan on the CPU (a tiny model; the local check gave torchtitan a
# stand-in device module: its trainer asks CUDA for memory), lines as they came, a few left out
TITAN_LOG = """$ python -m benchmarks.peer_runs titan --config recipes/standard_1b.yaml model.preset=tiny --dump /d
peers setup: {"flops_per_token": 801024, "peak_flops": null, "device_name": "cpu", "model_args": {"dim": 64, \
"n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "vocab_size": 257, "multiple_of": 16, "ffn_dim_multiplier": null, \
"norm_eps": 1e-05, "rope_theta": 10000.0, "max_seq_len": 256, "rope_scaling_factor": 1.0}, "tie_embeddings": false}
[titan] 2026-11-28 19:24:00,078 - root - INFO - torchtitan version: 0.2.2 (0.0.0 means __version__ is not defined \
correctly).
[titan] 2026-11-28 19:24:00,351 - root - INFO - Starting job: default job
[titan] 2026-11-28 19:24:00,399 - root - INFO - CPU memory usage for model: -0.00GiB(-0.00%)
[titan] 2026-11-28 19:24:00,406 - root - INFO - Mixed precision training is handled by AMP
[titan] 2026-11-28 19:24:00,407 - root - INFO - Trainer is initialized with local batch size 2, global batch size 4, \
gradient accumulation steps 2, sequence length 64, total steps 4 (warmup 2)
[titan] 2026-11-28 19:24:00,465 - root - INFO - step:  1  loss:  5.99300  grad_norm:  0.5273  memory: \
-0.00GiB(-0.00%)  tps: 3,221  tflops: 0.00  mfu: 0.00%
[titan] 2026-11-28 19:24:00,465 - root - INFO - Synchronizing and adjusting timeout for all ProcessGroups to 0:01:40
[titan] 2026-11-28 19:24:00,502 - root - INFO - step:  2  loss:  6.05994  grad_norm:  0.5317  memory: \
-0.00GiB(-0.00%)  tps: 6,927  tflops: 0.01  mfu: 0.00%
[titan] 2026-11-28 19:24:00,539 - root - INFO - step:  3  loss:  5.97484  grad_norm:  0.5263  memory: \
-0.00GiB(-0.00%)  tps: 7,059  tflops: 0.01  mfu: 0.00%
[titan] 2026-11-28 19:24:00,581 - root - INFO - step:  4  loss:  6.04110  grad_norm:  0.5306  memory: \
-0.00GiB(-0.00%)  tps: 6,160  tflops: 0.00  mfu: 0.00%
[titan] 2026-11-28 19:24:02,623 - root - INFO - Training completed
"""
# the same line as MetricsProcessor.log prints it with colours on (utils.Color), at the 1.2B's figures on an H200
COLOURED = (
    "[titan] 2026-11-28 20:00:00,000 - root - INFO - \x1b[31mstep: 12  \x1b[32mloss: 10.81234  \x1b[38;2;180;60;0m"
    "grad_norm:  1.0312  \x1b[38;2;54;234;195mmemory: 41.23GiB(29.39%)  \x1b[34mtps: 30,123  \x1b[36mtflops: 263.83  "
    "\x1b[35mmfu: 26.68%\x1b[39m"
)


def test_a_torchtitan_log_is_read_into_a_row():
    log = peers.parse_titan_log(TITAN_LOG)
    assert (log["version"], log["precision"]) == ("0.2.2", "autocast")
    assert [s["tokens_per_s"] for s in log["steps"]] == [3221, 6927, 7059, 6160]
    assert log["steps"][0] == {
        "step": 1,
        "loss": 5.993,
        "memory_gib": -0.0,
        "tokens_per_s": 3221,
        "tflops": 0.0,
        "mfu": 0.0,
    }
    row = peers.titan_row(TITAN_LOG, skip=1)
    assert (row["measured_steps"], row["tokens_per_s_median"]) == ([2, 4], 6927)
    assert (row["tokens_per_s_min"], row["tokens_per_s_max"]) == (6160, 7059)
    assert row["mfu_median"] is None and row["model_args"]["multiple_of"] == 16 and row["tie_embeddings"] is False
    assert "missing" not in row
    step = peers.parse_titan_log(COLOURED)["steps"][0]
    assert step == {
        "step": 12,
        "loss": 10.81234,
        "memory_gib": 41.23,
        "tokens_per_s": 30123,
        "tflops": 263.83,
        "mfu": pytest.approx(0.2668),
    }
    setup = {"flops_per_token": flops_per_token(preset_args("1.2B"), 2048), "peak_flops": 989.4e12}
    text = peers.SETUP + json.dumps(setup) + "\nApplied FSDP to the model\n" + COLOURED
    row = peers.titan_row(text, skip=0)
    assert row["precision"] == "FSDP2" and row["peer_mfu_median"] == pytest.approx(0.2668)
    assert row["mfu_median"] == pytest.approx(30123 * 8_758_453_248 / 989.4e12)  # ours: the same FLOPs, our peak
    assert peers.titan_row("Traceback ...", skip=5)["missing"] == "no step line in torchtitan's log"


def fake_part(tmp_path, kind, found=None, micro=2, log=""):
    out = tmp_path / f"{kind}.json"
    if found is not None:
        out.write_text(json.dumps(found) + "\n")
    (tmp_path / f"{kind}.log").write_text(log)
    info = {"out": out, "skip": 1, "micro_batch": micro, "global_batch": 16}
    outcome = {"rc": 0, "timed_out": False, "stopped": False, "interrupted": False, "wall_s": 12.0}
    argv = [sys.executable, "-m", "benchmarks.peer_runs", kind]
    return SimpleNamespace(kind=kind, info=info, log=tmp_path / f"{kind}.log", argv=argv, outcome=outcome)


BARE = {"step_times_s": [9.0, 0.5, 0.4, 0.6], "tokens_per_step": 32768, "accumulate": "unsharded"}
BARE |= {"flops_per_token": 8_758_453_248, "peak_flops": 989.4e12, "peak_mem_gib": 30.5, "device_name": "NVIDIA H200"}
DECODE = {"peer": "transformers", "peer_version": "5.17.0", "n_layers": 40, "batch": 1, "prompt_len": 512}
DECODE |= {"gen_len": 256, "tpot_ms": 2.5, "prefill_ms": 30.0, "compiled": True, "attn_implementation": "sdpa"}


def test_the_bare_loop_and_decode_outputs_become_rows(tmp_path):
    (bare,) = peers.rows(fake_part(tmp_path, "bare_loop", BARE), None)
    assert bare["kind"] == "bare_loop" and bare["micro_batch"] == 2 and bare["error"] is None
    assert bare["tokens_per_s_median"] == 32768 / 0.5 and bare["measured_steps"] == [2, 4]
    assert bare["step_time_s_median"] == 0.5 and bare["accumulate"] == "unsharded" and bare["rc"] == 0
    assert bare["mfu_median"] == pytest.approx(65536 * 8_758_453_248 / 989.4e12)
    (decode,) = peers.rows(fake_part(tmp_path, "peer_decode", DECODE, micro=None), None)
    assert decode["tpot_ms"] == 2.5 and decode["peer_version"] == "5.17.0" and decode["error"] is None
    assert decode["command"] == "python -m benchmarks.peer_runs peer_decode"
    (tmp_path / "none").mkdir()
    (lost,) = peers.rows(fake_part(tmp_path / "none", "peer_decode"), None)  # the part wrote nothing
    assert lost["error"] == "no TPOT from transformers' decode"
    (failed,) = peers.rows(fake_part(tmp_path, "bare_loop", {}), "FAILED (exit 1): boom")
    assert failed["error"] == "FAILED (exit 1): boom"
    (titan,) = peers.rows(fake_part(tmp_path, "peer_train", log=TITAN_LOG), None)
    assert titan["peer"] == "torchtitan" and titan["tokens_per_s_median"] == 6927 and titan["error"] is None
    assert runs.tpot_ms([10.0, 12.0, 11.0], [2.0, 3.0, 4.0], 5) == (11.0 - 3.0) / 4


def ours(kind, **fields):
    return {"kind": kind, "layout": "standard", "error": None, **fields}


def test_ours_over_theirs_from_the_rows_of_one_invocation():
    rows = [
        ours("train", micro_batch=2, tokens_per_s_median=30000.0, variant=[]),
        ours("train", micro_batch=2, tokens_per_s_median=99999.0, variant=["parallel.blocks_per_fsdp_unit=4"]),
        ours("train", micro_batch=8, tokens_per_s_median=60000.0, layout="ladder"),  # not the peers' layout
        ours("decode", n_layers=40, prompt_len=512, gen_len=256, tpot_ms=2.0, gemv_tuning=True),
        ours("decode", n_layers=40, prompt_len=512, gen_len=256, tpot_ms=1.8, gemv_tuning=False),
        ours("decode", n_layers=8, prompt_len=512, gen_len=256, tpot_ms=0.5, gemv_tuning=True),  # other layers
        ours("peer_train", micro_batch=2, tokens_per_s_median=25000.0),
        ours("peer_train", micro_batch=8, tokens_per_s_median=50000.0),
        ours("bare_loop", micro_batch=2, tokens_per_s_median=31250.0),
        ours("peer_decode", micro_batch=None, n_layers=40, prompt_len=512, gen_len=256, tpot_ms=2.4),
    ]
    peers.add_ratios(rows)
    titan2, titan8, bare, decode = rows[6:]
    assert titan2["ours_tokens_per_s"] == 30000.0 and titan2["ours_over_theirs"] == pytest.approx(1.2)
    assert titan8["ours_over_theirs"] is None  # no train row of the standard layout at micro-batch 8
    assert bare["trainer_over_bare"] == pytest.approx(0.96)
    assert (decode["ours_tpot_ms"], decode["ours_gemv_tuning"]) == (1.8, False)
    assert decode["ours_over_theirs"] == pytest.approx(0.75)
    lines = [
        peers.table_line(r | {"tokens_per_s_min": 1.0, "tokens_per_s_max": 2.0, "mfu_median": 0.25})
        for r in (titan2 | {"peer_version": "0.2.2", "precision": "autocast"}, bare | {"accumulate": "unsharded"})
    ]
    assert "torchtitan 0.2.2 (autocast); ours / theirs 1.200" in lines[0] and "25.0%" in lines[0]
    assert "trainer / bare 0.960" in lines[1]
    line = peers.table_line(decode | {"peer_version": "5.17.0", "compiled": True})
    assert "TPOT 2.400 ms (40 layers, static cache, compiled); ours 1.800 ms, ours / theirs 0.750" in line


def test_transformers_decodes_our_export_with_a_static_cache_on_the_cpu(tmp_path):
    """Eager on the CPU (compiled, the tiny decode took ~70 s of two cores): the export, the generate calls, TPOT."""
    argv = ["hf-decode", "--preset", "tiny", "--layers", "2", "--vocab", "257", "--prompt", "8", "--new", "4"]
    opts = runs.parse_args(
        [*argv, "--warmup", "1", "--runs", "2", "--no-compile", "--work", str(tmp_path), "--out", "x"]
    )
    found = runs.hf_decode(opts)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (found["n_layers"], found["prompt_len"], found["gen_len"], found["batch"]) == (2, 8, 4, 1)
    assert found["compiled"] is False and found["settings"]["cache_implementation"] == "static"
    assert len(found["generate_ms"]) == len(found["generate_one_ms"]) == 2
    assert found["tpot_ms"] == pytest.approx(runs.tpot_ms(found["generate_ms"], found["generate_one_ms"], 4))
    assert "missing" not in peers.decode_row(found)


@pytest.mark.slow
def test_the_bare_loop_trains_our_model_in_its_own_process(tmp_path):
    out = tmp_path / "bare.json"
    config = ["--config", "recipes/standard_1b.yaml", "model.preset=tiny", "model.vocab_size=257", "data.seq_len=64"]
    config += ["train.global_batch_size=4", "train.micro_batch_size=2", "train.max_steps=3", "parallel.compile=false"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.peer_runs", "bare", *config, "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    assert len(found["step_times_s"]) == 3 and found["tokens_per_step"] == 4 * 64 and found["accumulate"] == "none"


def test_the_peers_modules_stay_short():
    for name in ("peers.py", "peer_runs.py"):
        text = (REPO / "benchmarks" / name).read_text()
        assert len(text.splitlines()) <= 400
        long = [
            n.name
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 60
        ]
        assert long == [], name
