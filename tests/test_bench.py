"""ladder-bench (``ladder_train.bench``): the command at TP = 2 writes consistent results, eager and compiled;
bad input (a TP degree or layout it cannot run, a damaged checkpoint, compile with the emulated link) is one line
before any rank starts; the latency note compares the emulated X with the shorter module. Compiled, the warm-up
is >= 2 runs, a timed run that compiles or records a graph fails, and a model keeps one cache across its runs.
``--profile`` traces every rank, where the ladder's all-reduces run beside the next module."""

import json
import statistics

import pytest
import torch
from dist_utils import save_training_checkpoint

from ladder_train.bench.results import distribution, latency_note
from ladder_train.bench_schema import FIELDS
from ladder_train.cli import ladder_bench as bench_main
from ladder_train.model import ModelArgs, Transformer


def test_bench_refuses_a_tp_degree_or_layout_it_cannot_run(capsys):
    capsys.readouterr()
    assert bench_main(["--model", "tiny", "--tp", "3"]) == 2
    assert capsys.readouterr().err == "ladder-bench: error: tiny: tensor-parallel degree 3 does not divide n_heads=4\n"
    assert bench_main(["--model", "tiny", "--layouts", "standard,lader"]) == 2
    assert "ladder-bench: error: --layouts 'standard,lader'" in capsys.readouterr().err


def test_the_library_names_an_option_by_its_field_and_the_command_by_its_flag(capsys):
    from ladder_train.bench.options import BenchOptions, measurements
    from ladder_train.option_errors import OptionError

    with pytest.raises(OptionError) as err:
        measurements(BenchOptions(models=("tiny",), gen_len=1), tp=1)
    assert str(err.value) == "need gen_len >= 2, prompt_len >= 1, runs >= 1, warmup >= 0"
    assert bench_main(["--model", "tiny", "--gen-len", "1"]) == 2
    assert (
        capsys.readouterr().err
        == "ladder-bench: error: need --gen-len >= 2, --prompt-len >= 1, --runs >= 1, --warmup >= 0\n"
    )


@pytest.mark.slow
def test_bench_cli_two_ranks_writes_consistent_results(tmp_path):
    out = tmp_path / "bench.jsonl"
    argv = ["--model", "tiny", "--set", "vocab_size=128", "--tp", "2", "--batch-sizes", "1,2", "--prompt-len", "8"]
    argv += ["--gen-len", "4", "--runs", "3", "--warmup", "0", "--link-latency-ms", "1", "--out", str(out)]
    bench_main(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["layout"], r["batch"]) for r in rows] == [
        (lay, b) for b in (1, 2) for lay in ("standard", "parallel", "ladder")
    ]
    assert {key for row in rows for key in row} <= set(FIELDS)  # every field a row holds is documented
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
        assert ("overlap_efficiency" in row) == (row["layout"] == "ladder")  # overlap: the ladder's alone
        # the serving benchmarks' figures: TTFT and TPOT distributions over the 3 timed runs, with their samples
        ttft, tpot = row["ttft_ms"], row["tpot_ms"]
        assert len(ttft["samples"]) == len(tpot["samples"]) == len(row["tokens_per_s_runs"]["samples"]) == 3
        assert ttft["p50"] == pytest.approx(row["prefill_ms"]) and tpot["p50"] == pytest.approx(
            row["decode_ms_per_token"]
        )
        assert min(tpot["samples"]) <= tpot["p50"] <= tpot["p90"] <= tpot["p99"] <= max(tpot["samples"])
        assert tpot["sd"] == pytest.approx(statistics.stdev(tpot["samples"]))
        assert row["peak_memory_of"] == "process peak RSS (CPU)" and 0.05 < row["peak_memory_gib"] < 64


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


def test_distribution_gives_numpy_percentiles_and_keeps_the_samples_in_run_order():
    values = [3.0, 1.0, 2.0, 10.0, 4.0]
    summary = distribution(values)
    assert (summary["p50"], summary["p90"], summary["p99"]) == pytest.approx((3.0, 7.6, 9.76))  # numpy's linear
    assert summary["mean"] == 4.0 and summary["sd"] == pytest.approx(3.5355, abs=1e-4)
    assert summary["samples"] == values
    assert distribution([2.5])["sd"] is None and distribution([2.5])["p99"] == 2.5


def test_the_environment_record_tells_invocations_apart_and_names_the_machine():
    """One record for ladder-bench's rows and the repository's benchmarks: the id holds the start to the microsecond
    (two invocations of one process in one second differ); date and start are UTC; the host names CPU, threads and
    versions."""
    import datetime

    from ladder_train.bench.environment import host, invocation

    started = datetime.datetime(2026, 11, 28, 23, 59, 59, 5, tzinfo=datetime.UTC)
    record = invocation(["python", "-m", "benchmarks.x", "--out", "a b"], started)
    assert record == {
        "invocation": record["invocation"],
        "command": "python -m benchmarks.x --out 'a b'",
        "date": "2026-11-28",
        "started": "2026-11-28T23:59:59+00:00",
    }
    assert record["invocation"].startswith("20261128T235959.000005-")
    assert "command" not in invocation()  # ladder-bench's rows: no command line
    machine = host()
    assert machine["cpu_model"] and machine["torch_threads"] >= 1 and machine["versions"]["torch"]


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


@pytest.mark.slow  # compiles
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


# -- --profile: a chrome trace per rank of one more, untimed generation of each case ---------------------------


def _ops_in(region: dict, events: list[dict], names: tuple[str, ...]) -> list[str]:
    """The names of ``events`` among ``names`` inside ``region`` on its thread, in time order."""
    end = region["ts"] + region["dur"]
    inside = [e for e in events if e["tid"] == region["tid"] and region["ts"] <= e["ts"] <= end and e["name"] in names]
    return [e["name"] for e in sorted(inside, key=lambda e: e["ts"])]


def _overlapped(ops: list[str]) -> int:
    """How many all-reduces have a matmul between their issue and their wait (waits come in issue order)."""
    pending, count = [], 0
    for name in ops:
        if name == "_c10d_functional::all_reduce":
            pending.append(False)
        elif name == "aten::mm":
            pending = [True] * len(pending)
        else:  # the wait of the oldest pending all-reduce
            count += pending.pop(0)
    return count


@pytest.mark.slow
def test_bench_profile_traces_every_rank_with_each_all_reduce_beside_the_next_module(tmp_path):
    argv = ["--model", "tiny", "--set", "vocab_size=128", "--tp", "2", "--batch-sizes", "1", "--prompt-len", "8"]
    argv += ["--gen-len", "4", "--runs", "1", "--warmup", "0", "--profile", str(tmp_path / "traces")]
    assert bench_main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == [
        "rank0_batch1.pt.trace.json",
        "rank1_batch1.pt.trace.json",
    ]
    ops = ("_c10d_functional::all_reduce", "_c10d_functional::wait_tensor", "aten::mm")
    # 4 forwards (the prefill, 3 decode steps) of 2 layers: the standard and ladder reduce 2 modules a layer, parallel 1
    all_reduces = {"standard": 16, "parallel": 8, "ladder": 16}
    for rank in (0, 1):
        trace = json.loads((tmp_path / "traces" / f"rank{rank}_batch1.pt.trace.json").read_text())
        assert trace["distributedInfo"]["rank"] == rank
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        regions = {e["name"]: e for e in events if e["name"].endswith(" batch=1")}
        assert sorted(regions) == sorted(f"{lay} comm={c} batch=1" for lay in all_reduces for c in ("real", "none"))
        assert sum(e["name"] == "gloo:all_reduce" for e in events) == sum(all_reduces.values())
        for layout, count in all_reduces.items():
            real = _ops_in(regions[f"{layout} comm=real batch=1"], events, ops)
            assert real.count("_c10d_functional::all_reduce") == real.count("_c10d_functional::wait_tensor") == count
            assert real.count("aten::mm") > 0
            # the ladder waits one module later: each all-reduce but the last of a forward runs beside a module
            assert _overlapped(real) == (4 * 3 if layout == "ladder" else 0), layout
            none = _ops_in(regions[f"{layout} comm=none batch=1"], events, ops)
            assert "_c10d_functional::all_reduce" not in none and none.count("aten::mm") == real.count("aten::mm")


def test_bench_refuses_a_profile_path_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "traces"
    target.write_text("")
    capsys.readouterr()
    assert bench_main(["--model", "tiny", "--tp", "2", "--profile", str(target)]) == 2
    assert capsys.readouterr().err == f"ladder-bench: error: --profile {target}: not a folder\n"


def test_module_times_on_a_gpu_time_the_replays_of_one_cuda_graph(monkeypatch):
    """On CUDA the module is captured once and its replays are timed (kernel time, no eager launch gaps); the
    capture itself needs a GPU, so it and the events are stand-ins that record what is done with them."""
    from ladder_train.bench import module_times

    calls = []
    elapsed = iter([9.0, 8.0, 3.0, 1.0, 2.0])  # two warm-ups, then three timed replays

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            calls.append("record")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return next(elapsed)

    def capture(fn, device):
        calls.append(("capture", fn))
        return lambda: calls.append("replay")

    monkeypatch.setattr(module_times, "_as_cuda_graph", capture)
    monkeypatch.setattr(torch.cuda, "Event", Event)

    def module():
        calls.append("eager call")

    assert module_times._kernel_ms(module, torch.device("cuda"), reps=3) == 2.0  # median of 3.0, 1.0, 2.0
    assert calls[0] == ("capture", module) and "eager call" not in calls
    assert calls[1:] == ["record", "replay", "record"] * 5


def test_the_emulated_link_is_refused_where_a_gpu_would_run(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench_main(["--model", "tiny", "--tp", "2", "--link-latency-ms", "1"]) == 2
    assert "emulate a link on the CPU only" in capsys.readouterr().err


def test_an_out_path_that_cannot_be_written_is_refused_before_any_rank_runs(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("")
    assert bench_main(["--model", "tiny", "--out", str(tmp_path / "file.txt" / "bench.jsonl")]) == 2
    assert "file.txt/bench.jsonl: not a file path whose folders can be made" in capsys.readouterr().err
    assert bench_main(["--model", "tiny", "--out", str(tmp_path)]) == 2


def test_the_closing_lines_quote_the_module_times_of_the_smallest_batch_they_name(capsys):
    from ladder_train.bench.results import print_table

    def row(layout, batch, attention, mlp):
        return dict(
            model="tiny",
            layout=layout,
            batch=batch,
            prefill_ms=1.0,
            decode_ms_per_token=1.0,
            tokens_per_s=1.0,
            module_ms={"attention": attention, "mlp": mlp},
        )

    rows = [row("standard", 4, 0.621, 1.414), row("ladder", 1, 0.5, 0.5), row("standard", 1, 0.21, 0.66)]
    env = dict(
        emulated_link_latency_ms=1.0, link="emulated", device="cpu", tp=2, backend="gloo", dtype="float32", torch="x"
    ) | {"compiled": False}
    print_table(rows, env)
    out = capsys.readouterr().out
    assert (
        "tiny: measured decode compute per module on one rank (layer 0, batch 1): attention 0.210 ms, mlp 0.660 ms"
        in out
    )
    assert "bounded near 1 + c/X = 1.44x" in out  # 1 + mean(0.21, 0.66) / 1.0


def test_a_long_model_name_keeps_its_own_column(capsys):
    from ladder_train.bench.results import print_table

    row = dict(model="runs/ds2/checkpoints/step-6", layout="desync-2", batch=1, prefill_ms=1.0)
    rows = [row | dict(decode_ms_per_token=1.0, tokens_per_s=1.0)]
    env = dict(emulated_link_latency_ms=0, link="nccl", device="cpu", tp=2, backend="gloo", dtype="float32", torch="x")
    print_table(rows, env | {"compiled": False})
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("model"))
    assert lines[head + 2].split()[:3] == ["runs/ds2/checkpoints/step-6", "desync-2", "1"]
    assert lines[head].index("layout") == lines[head + 2].index("desync-2")  # the columns line up
