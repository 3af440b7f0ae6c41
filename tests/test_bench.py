"""ladder-bench (``ladder_train.bench``): the command at TP = 2 writes consistent results, eager and compiled;
bad input (a TP degree or layout it cannot run, a damaged checkpoint, compile with the emulated link) is one line
before any rank starts; the latency note compares the emulated X with the shorter module. Compiled, the warm-up
is >= 2 runs, a timed run that compiles or records a graph fails, and a model keeps one cache across its runs."""

import json

import pytest
import torch
from dist_utils import save_training_checkpoint

from ladder_train.bench.results import latency_note
from ladder_train.cli import ladder_bench as bench_main
from ladder_train.model import ModelArgs, Transformer


def test_bench_refuses_a_tp_degree_or_layout_it_cannot_run(capsys):
    capsys.readouterr()
    assert bench_main(["--model", "tiny", "--tp", "3"]) == 2
    assert capsys.readouterr().err == "ladder-bench: error: tiny: tensor-parallel degree 3 does not divide n_heads=4\n"
    assert bench_main(["--model", "tiny", "--layouts", "standard,lader"]) == 2
    assert "ladder-bench: error: --layouts 'standard,lader'" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_cli_two_ranks_writes_consistent_results(tmp_path):
    out = tmp_path / "bench.jsonl"
    argv = ["--model", "tiny", "--set", "vocab_size=128", "--tp", "2", "--batch-sizes", "1,2", "--prompt-len", "8"]
    argv += ["--gen-len", "4", "--runs", "1", "--warmup", "0", "--link-latency-ms", "1", "--out", str(out)]
    bench_main(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["layout"], r["batch"]) for r in rows] == [
        (lay, b) for b in (1, 2) for lay in ("standard", "parallel", "ladder")
    ]
    for row in rows:
        assert row["tp"] == 2 and row["emulated_link_latency_ms"] == 1.0 and row["backend"] == "gloo"
        assert row["torch"] == torch.__version__ and row["device"].startswith("cpu")
        std = next(r for r in rows if r["layout"] == "standard" and r["batch"] == row["batch"])
        assert row["decode_speedup_vs_standard"] == pytest.approx(
            std["decode_ms_per_token"] / row["decode_ms_per_token"]
        )
        assert row["comm_share"] == pytest.approx(1 - std["none"]["decode_ms_per_token"] / std["decode_ms_per_token"])
        assert row["tokens_per_s"] > 0 and row["prefill_ms"] > 0 and set(row["module_ms"]) == {"attention", "mlp"}
        # every standard all-reduce is held >= 1 ms: 2 per layer, 2 layers
        if row["layout"] == "standard":
            assert row["decode_ms_per_token"] >= 4.0
        assert ("overlap_efficiency" in row) == (row["layout"] != "standard")


@pytest.mark.slow
def test_bench_compile_on_runs_the_three_layouts_with_bounded_compilations(tmp_path):
    out = tmp_path / "bench.jsonl"
    argv = ["--model", "tiny", "--set", "vocab_size=97", "dim=64", "n_layers=2", "n_heads=4", "ffn_dim=128"]
    argv += ["max_seq_len=32", "--tp", "2", "--batch-sizes", "1", "--prompt-len", "6", "--gen-len", "4"]
    argv += ["--runs", "1", "--warmup", "2", "--compile", "on", "--compile-backend", "aot_eager", "--out", str(out)]
    bench_main(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["layout"] for r in rows] == ["standard", "parallel", "ladder"]
    for row in rows:
        assert row["compiled"] is True and row["compile_backend"] == "aot_eager" and row["tp"] == 2
        # 3 models x (real, none) communicators x 1 batch size, a prefill and a decode graph each
        assert row["compilations"] == 12
        assert row["model_args"]["dim"] == 64 and row["link"] == "gloo"
        assert row["speedup_vs_standard"] == pytest.approx(row["tokens_per_s"] / rows[0]["tokens_per_s"])


def test_latency_note_compares_x_with_the_shorter_module():
    below = latency_note(20.0, {"attention": 30.0, "mlp": 31.0})
    assert below.startswith("Emulated X = 20 ms is 0.67x the shorter module's") and "overlap can hide it all" in below
    above = latency_note(90.0, {"attention": 31.0, "mlp": 29.0})
    # the serialised link is busy 90 ms per all-reduce: at best (30 + 90) / 90 per module
    assert "3.1x" in above and "bounded near 1 + c/X = 1.33x" in above


def test_bench_refuses_a_damaged_checkpoint_in_one_line(tmp_path, capsys):
    torch.manual_seed(0)
    model = Transformer(
        ModelArgs(vocab_size=97, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64, residual="ladder")
    )
    path = save_training_checkpoint(model, tmp_path / "run")
    shard = max(path.glob("*.distcp"), key=lambda f: f.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # one flipped bit in the weights
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert bench_main(["--model", str(path), "--gen-len", "2", "--prompt-len", "2"]) == 1  # a RunFailed
    message = capsys.readouterr().err
    assert message.startswith(f"ladder-bench: error: {path}") and message.count("\n") == 1


def test_bench_refuses_compile_with_the_emulated_link(capsys):
    assert bench_main(["--model", "tiny", "--compile", "on", "--link-latency-ms", "2"]) == 2
    assert (
        capsys.readouterr().err == "ladder-bench: error: the emulated link sleeps on the host and needs --compile off\n"
    )
    for warmup in ("0", "1"):  # the first run compiles, the second records the CUDA graphs
        assert bench_main(["--model", "tiny", "--compile", "on", "--warmup", warmup]) == 2
        assert capsys.readouterr().err.startswith("ladder-bench: error: --compile on needs --warmup >= 2 (")


TINY_TP1 = [
    "--model",
    "tiny",
    "--set",
    "vocab_size=97",
    "dim=32",
    "n_layers=2",
    "max_seq_len=16",
    "--layouts",
    "ladder",
]
TINY_TP1 += ["--batch-sizes", "1", "--prompt-len", "4", "--gen-len", "3", "--runs", "2", "--no-ceiling"]


def test_bench_compiled_at_tp1_compiles_in_the_warm_up_only_and_keeps_its_cache(tmp_path, monkeypatch):
    from ladder_train.bench import runner

    out = tmp_path / "bench.jsonl"
    caches = set()
    setup = runner.Generator.setup

    def watched_setup(gen, batch, max_len):
        setup(gen, batch, max_len)
        caches.add(tuple(id(cache.k) for cache in gen.model.kv_caches()))

    monkeypatch.setattr(runner.Generator, "setup", watched_setup)
    argv = [*TINY_TP1, "--warmup", "2", "--compile", "on", "--compile-backend", "aot_eager", "--out", str(out)]
    assert bench_main(argv) == 0
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["compiled"] is True and row["warmup"] == 2 and row["compilations"] == 2  # a prefill and a decode
    assert len(caches) == 1  # one cache, zeroed between the 4 runs, never reallocated


def test_bench_fails_when_a_timed_run_compiles(monkeypatch, capsys):
    from ladder_train.bench import runner

    events = iter(range(1000))
    monkeypatch.setattr(runner, "graph_events", lambda: next(events))  # every run "compiles"
    with pytest.raises(RuntimeError, match=r"timed run 1 of tiny \(ladder, comm real, batch 1\) compiled or recorded"):
        bench_main([*TINY_TP1, "--warmup", "1", "--compile", "off"])
