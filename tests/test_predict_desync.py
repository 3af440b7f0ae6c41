"""ladder-predict with desync layouts: the timeline issues only the all-reduces ``ModelArgs.layer_reduces`` names
(synchronous, as standard's), every predicted row carries its all-reduces per decode step, ``--compare`` predicts a
desync row from its own model_args, and a desync layout is refused at TP 1 in one line."""

import dataclasses
import json

import pytest

from ladder_train.cli import ladder_predict as predict_main
from ladder_train.errors import InputError
from ladder_train.predict import compare
from ladder_train.predict.hardware import load_profiles
from ladder_train.predict.perfmodel import Emulated, all_reduces_per_step, predict_rows, simulate, step_ops
from ladder_train.predict.shapes import resolve_shape

# compute seconds per module given directly, as tests/test_predict.py's timelines
T = {"embed": 1.0, "attention": 2.0, "mlp": 3.0, "parallel": 4.0, "head": 1.0}


def run(layouts, reduces, comm_s=1.0):
    return simulate(step_ops(layouts, T, True, reduces), lambda _m: [("link", comm_s, 0.0)])


def test_timeline_desync_waits_on_the_all_reduces_it_issues_only():
    # standard: 1 + 2 x (2 + 1 + 3 + 1) + 1 = 16
    assert run(["standard"] * 2, None) == 16.0
    # desync-2 (each MLP): 1 + 2 x (2 + 3 + 1) + 1 = 14
    assert run(["desync"] * 2, [(False, True), (False, True)]) == 14.0
    # desync-4 on 2 layers (layer 1's MLP, the last module): 1 + 5 + 6 + 1 = 13; every module: standard's 16
    assert run(["desync"] * 2, [(False, False), (False, True)]) == 13.0
    assert run(["desync"] * 2, [(True, True), (True, True)]) == 16.0
    # a hybrid: layer 0 standard (7), layer 1 desync reducing its MLP (6): 1 + 7 + 6 + 1
    assert run(["standard", "desync"], [(True, True), (False, True)]) == 15.0


def test_the_all_reduces_per_step_are_layer_reduces_and_the_layouts():
    shape = resolve_shape("tiny", overrides={"n_layers": 4})
    counts = {lay: all_reduces_per_step(shape, lay, 2) for lay in ("standard", "parallel", "ladder", "none")}
    assert counts == {"standard": 8, "parallel": 4, "ladder": 8, "none": 0}
    assert [all_reduces_per_step(shape, f"desync-{k}", 2) for k in (1, 2, 4)] == [8, 4, 2]  # all, half, a quarter
    for every in (1, 2, 3, 4, 5, 8):
        args = dataclasses.replace(shape.args, residual="desync", desync_tp=2, desync_reduce_every=every)
        assert all_reduces_per_step(shape, f"desync-{every}", 2) == sum(map(sum, args.layer_reduces()))
    assert all_reduces_per_step(shape, "desync-3", 2) == 3  # modules 3 and 6, and the last (8) always
    hybrid = resolve_shape("tiny", overrides={"n_layers": 4, "desync_layers": 2})
    assert all_reduces_per_step(hybrid, "desync-2", 2) == 2 * 2 + 2
    with pytest.raises(InputError, match="not predicted at TP 1"):
        all_reduces_per_step(shape, "desync-2", 1)


def test_ladder_predict_rows_carry_the_all_reduces_and_desync_speeds_up_with_fewer(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    argv = ["--model", "llama-8b", "--gpu", "h100", "--link", "pcie", "--tp", "2,8", "--batch-sizes", "1,64"]
    argv += ["--layouts", "standard,ladder,desync-2,desync-4", "--prompt-len", "64", "--gen-len", "8"]
    assert predict_main([*argv, "--out", str(out)]) == 0
    assert "ARs/step" in capsys.readouterr().out
    rows = {(r["tp"], r["batch"], r["layout"]): r for r in map(json.loads, out.read_text().splitlines())}
    for tp in (2, 8):
        for batch in (1, 64):
            by = {lay: rows[tp, batch, lay] for lay in ("standard", "ladder", "desync-2", "desync-4", "none")}
            assert [by[lay]["all_reduces_per_decode_step"] for lay in by] == [64, 64, 32, 16, 0]
            assert 1 < by["desync-2"]["decode_speedup_vs_standard"] < by["desync-4"]["decode_speedup_vs_standard"]
            assert by["desync-4"]["decode_ms_per_token"] > by["none"]["decode_ms_per_token"]


def test_a_desync_layout_is_refused_at_tp_1(capsys):
    assert predict_main(["--model", "tiny", "--gpu", "cpu", "--tp", "2,1", "--layouts", "desync-2"]) == 2
    assert capsys.readouterr().err == (
        "ladder-predict: error: --layouts desync-2: a desync layout is built for the tensor-parallel degree it runs at "
        "and needs --tp >= 2 (at TP 1 there is no all-reduce to skip)\n"
    )


def bench_row(layout, decode_ms, speedup, **desync):
    args = dict(vocab_size=512, dim=256, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=512, max_seq_len=64)
    args |= {"residual": layout.split("-")[0], "ladder_layers": None, **desync}
    return {
        "model": "tiny",
        "shape": "L4-d256-h4-f512-v512",
        "model_args": args,
        "layout": layout,
        "batch": 1,
        "prompt_len": 8,
        "gen_len": 8,
        "decode_ms_per_token": decode_ms,
        "tp": 2,
        "compiled": False,
        "emulated_link_latency_ms": 6.0,
        "decode_speedup_vs_standard": speedup,
    }


def test_compare_predicts_a_desync_row_from_its_own_fields(tmp_path, capsys):
    """A desync-K row of ladder-bench and a saved model's ``desync`` row (its own pattern, a hybrid) are each
    predicted as their model_args say; an older standard row without desync fields still reads."""
    pattern = dict(desync_tp=2, desync_layers=2, desync_pattern=["none", "attention"])
    rows = [
        bench_row("standard", 60.0, 1.0),
        bench_row("desync-2", 30.0, 2.0, desync_tp=2, desync_reduce_every=2),
        bench_row("desync", 40.0, 1.5, **pattern),
    ]
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cpu = load_profiles()["cpu"]
    results, _ = compare.compare_with_bench(compare.bench_rows(str(path)), cpu)
    shape = compare.shape_from_fields("L4-d256-h4-f512-v512", rows[2]["model_args"], True, "t")
    pred = {r["layout"]: r for r in predict_rows(shape, cpu, "gloo", 2, [1], 8, 8, Emulated(6e-3), ("desync",))}
    # layers 0-1 standard (4), layer 2 none, layer 3 its attention and, the last module, its MLP (2)
    assert pred["desync"]["all_reduces_per_decode_step"] == 6
    std, two, own = results
    assert own["pred_decode_ms"] == pred["desync"]["decode_ms_per_token"]
    assert own["pred_speedup"] == pytest.approx(pred["desync"]["decode_speedup_vs_standard"])
    assert 1.0 < own["pred_speedup"] < two["pred_speedup"]  # 6 all-reduces a step against desync-2's 4
    assert two["speedup_err"] == pytest.approx(two["pred_speedup"] / 2.0 - 1)
    # a saved desync model benchmarked at TP 1 runs its emulation, which the model does not predict
    path.write_text(json.dumps({**rows[2], "tp": 1}) + "\n")
    assert predict_main(["--compare", str(path)]) == 2
    assert "a desync model built for TP 2 is not predicted at TP 1" in capsys.readouterr().err


def test_validate_hands_its_layouts_to_ladder_bench(tmp_path, capsys):
    from ladder_train.predict.validation import bench_command

    command = bench_command("n_layers=2", 1, 4, 4, 2.0, 1, tmp_path / "b.jsonl", ("standard", "desync-2"))
    assert command[command.index("--layouts") + 1] == "standard,desync-2"
    assert predict_main(["validate", "--out-dir", str(tmp_path / "v"), "--layouts", "standard,desync-x"]) == 2
    assert capsys.readouterr().err.startswith("ladder-predict: error: --layouts 'standard,desync-x': each")
    assert not (tmp_path / "v").exists()  # refused before anything is measured or written
    with pytest.raises(ValueError, match="layer 0's layout 'desync-2' is not"):  # a name, not a layer's layout
        step_ops(["desync-2"], T)
