"""Tensor-parallel inference on CPU/gloo: TP = 2 gives the single-process logits and tokens for every
layout, the ladder's async (and delayed) all-reduce changes timing, never values, and the benchmark CLI
writes consistent results."""

import dataclasses
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ladder_train.checkpoint import Checkpointer
from ladder_train.cli import bench as bench_main
from ladder_train.config import load_config
from ladder_train.inference import Generator, TPCommunicator, comm_mode_for, load_tp_model, sample
from ladder_train.inference.bench_results import latency_note
from ladder_train.inference.tp import EmulatedLinkCommunicator
from ladder_train.loading import load_model
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export
from ladder_train.model.transformer import RMSNorm
from ladder_train.parallel import free_port

SHAPE = dict(vocab_size=97, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
LAYOUTS = {"standard": ("standard", None), "parallel": ("parallel", None), "ladder": ("ladder", None)}
LAYOUTS["hybrid"] = ("ladder", 2)
PROMPT = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(1))
DECODE_STEPS = 8
LATENCY_MS = 2.0


def make_model(residual, ladder_layers):
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**SHAPE, residual=residual, ladder_layers=ladder_layers))
    with torch.no_grad():  # norms start at ones; perturb them so a wrongly handled norm shows
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model


def make_export(root, name, residual, ladder_layers):
    return save_export(make_model(residual, ladder_layers), root / name)


def make_checkpoint(root, residual, ladder_layers):
    """The weights of ``make_export``, saved as a training checkpoint by the trainer's own Checkpointer."""
    model = make_model(residual, ladder_layers)
    cfg = load_config(None, ["checkpoint.async_save=false"])
    checkpointer = Checkpointer(cfg.checkpoint, root, rank=0, world_size=1)
    optimizer = torch.optim.AdamW(model.parameters())
    return checkpointer.save(3, model, optimizer, {"model_args": dataclasses.asdict(model.args)}, {})


@torch.no_grad()
def run_model(model, comm=None, static=False):
    """Prefill logits, then DECODE_STEPS cached decode steps feeding fixed tokens, then the full-prefix
    recompute, then greedy and top-k generations."""
    if comm is not None:
        model.set_communicator(comm)
    feed = torch.randint(0, 97, (2, DECODE_STEPS), generator=torch.Generator().manual_seed(2))
    model.setup_kv_cache(2, PROMPT.shape[1] + DECODE_STEPS)
    steps = [model(PROMPT, start_pos=0)]
    for i in range(DECODE_STEPS):
        pos = PROMPT.shape[1] + i
        steps.append(model(feed[:, i : i + 1], start_pos=torch.tensor(pos) if static else pos))
    model.clear_kv_cache()
    cached = torch.cat(steps, dim=1)
    recompute = model(torch.cat([PROMPT, feed], dim=1))
    gen = Generator(model, dist.group.WORLD if dist.is_initialized() else None)
    greedy = gen.generate(PROMPT, 10)
    sampled = gen.generate(PROMPT, 10, temperature=1.0, top_k=5, seed=rank_seed())
    model.clear_kv_cache()
    return {"cached": cached, "recompute": recompute, "greedy": greedy, "sampled": sampled}


def rank_seed():
    # a different sampling seed on every rank: only the broadcast of rank 0's tokens can make them agree
    return 7 + (dist.get_rank() if dist.is_initialized() else 0)


def _worker(rank, world, port, exports, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for name, path in exports.items():
        model = load_tp_model(path, tp_rank=rank, tp_size=world)
        residual = model.args.residual
        results[name] = run_model(model, TPCommunicator(comm_mode_for(residual)))
        results[name]["static"] = run_model(model, TPCommunicator(comm_mode_for(residual)), static=True)["cached"]
        results[name]["local_wq_rows"] = model.layers[0].attention.wq.weight.shape[0]
        model.setup_kv_cache(1, 4)
        results[name]["local_kv_cache_heads"] = model.layers[0].attention.kv_cache.k.shape[1]
        model.clear_kv_cache()
        if residual == "ladder":
            results[name]["sync"] = run_model(model, TPCommunicator("sync"))["cached"]
            delayed = EmulatedLinkCommunicator("async", latency_ms=LATENCY_MS)
            results[name]["delayed"] = run_model(model, delayed)["cached"]
        results[name]["none"] = run_model(model, TPCommunicator("none"))["cached"]
    # the emulated link: a wait returns no earlier than issue time + X, in both modes
    x = torch.ones(4)
    for mode in ("async", "sync"):
        comm = EmulatedLinkCommunicator(mode, latency_ms=30.0)
        start = time.perf_counter()
        reduced = comm.wait(comm.reduce(x.clone()))
        results[f"latency_{mode}"] = (time.perf_counter() - start, reduced)
    # one serialised link: the second of two all-reduces in flight starts when the first ends
    comm = EmulatedLinkCommunicator("async", latency_ms=30.0)
    start = time.perf_counter()
    first, second = comm.reduce(x.clone()), comm.reduce(x.clone())
    comm.wait(first)
    first_done = time.perf_counter() - start
    comm.wait(second)
    results["serialised"] = (first_done, time.perf_counter() - start)
    # bytes / bandwidth: 4 MB at 0.2 GB/s occupies the link 20 ms on top of 5 ms
    comm = EmulatedLinkCommunicator("sync", latency_ms=5.0, bandwidth_gbs=0.2)
    start = time.perf_counter()
    comm.wait(comm.reduce(torch.ones(1_000_000)))
    results["bandwidth"] = time.perf_counter() - start
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """Every TP = 2 result, computed in one 2-process gloo run; plus the single-process references."""
    root = tmp_path_factory.mktemp("tp")
    exports = {name: str(make_export(root, name, *layout)) for name, layout in LAYOUTS.items()}
    sources = {**exports, "hybrid_checkpoint": str(make_checkpoint(root / "run", *LAYOUTS["hybrid"]))}
    mp.spawn(_worker, args=(2, free_port(), sources, str(root)), nprocs=2, join=True)
    ranks = [torch.load(root / f"rank{r}.pt") for r in range(2)]
    reference = {name: run_model(load_model(path).eval()) for name, path in exports.items()}
    reference["hybrid_checkpoint_tp1"] = run_model(load_tp_model(sources["hybrid_checkpoint"]))
    return ranks, reference


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tp2_prefill_and_decode_logits_equal_single_process(tp_run, layout):
    ranks, reference = tp_run
    for result in ranks:
        torch.testing.assert_close(result[layout]["cached"], reference[layout]["cached"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(result[layout]["static"], reference[layout]["cached"], atol=1e-5, rtol=1e-5)
    # each rank held half of the query heads (4 heads x head dim 8 in full) and cached 1 of the 2 kv heads
    assert ranks[0][layout]["local_wq_rows"] == 16 and ranks[0][layout]["local_kv_cache_heads"] == 1


@pytest.mark.slow
def test_tp_model_from_a_training_checkpoint_equals_its_export(tp_run):
    """A DCP checkpoint loads straight onto TP ranks (each reads its own shard) and gives the logits of
    the export of the same weights, at TP = 2 and in one process."""
    ranks, reference = tp_run
    expected = reference["hybrid"]["cached"]
    torch.testing.assert_close(reference["hybrid_checkpoint_tp1"]["cached"], expected, atol=1e-6, rtol=1e-6)
    for result in ranks:
        torch.testing.assert_close(result["hybrid_checkpoint"]["cached"], expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(result["hybrid_checkpoint"]["greedy"], reference["hybrid"]["greedy"])
    assert ranks[0]["hybrid_checkpoint"]["local_wq_rows"] == 16


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tp2_kv_cache_decode_equals_recomputing_the_prefix(tp_run, layout):
    ranks, _ = tp_run
    for result in ranks:
        torch.testing.assert_close(result[layout]["cached"], result[layout]["recompute"], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tp2_generation_gives_the_single_process_tokens_on_every_rank(tp_run, layout):
    ranks, reference = tp_run
    for result in ranks:
        assert torch.equal(result[layout]["greedy"], reference[layout]["greedy"])
    # sampling: each rank seeded differently, yet all continue with rank 0's tokens
    assert torch.equal(ranks[0][layout]["sampled"], ranks[1][layout]["sampled"])
    assert torch.equal(ranks[0][layout]["sampled"], reference[layout]["sampled"])  # rank 0 and the reference: seed 7


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["ladder", "hybrid"])
def test_ladder_async_and_delayed_reduce_change_timing_never_values(tp_run, layout):
    ranks, reference = tp_run
    for result in ranks:
        assert torch.equal(result[layout]["cached"], result[layout]["sync"])
        assert torch.equal(result[layout]["cached"], result[layout]["delayed"])
        torch.testing.assert_close(result[layout]["delayed"], reference[layout]["cached"], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_no_communication_ceiling_is_wrong_on_purpose(tp_run):
    ranks, reference = tp_run
    for layout in LAYOUTS:
        assert (ranks[0][layout]["none"] - reference[layout]["cached"]).abs().max() > 1e-3


@pytest.mark.slow
def test_emulated_link_latency_holds_each_all_reduce(tp_run):
    ranks, _ = tp_run
    for result in ranks:
        for mode in ("async", "sync"):
            elapsed, reduced = result[f"latency_{mode}"]
            assert elapsed >= 0.030
            assert torch.equal(reduced, torch.full((4,), 2.0))


@pytest.mark.slow
def test_emulated_link_serialises_all_reduces_in_flight(tp_run):
    """Two all-reduces issued back to back over a 30 ms link: the second ends 60 ms after the first issue,
    as on one NCCL stream (the emulation used to let their delays overlap: both done at 30 ms)."""
    ranks, _ = tp_run
    for result in ranks:
        first_done, second_done = result["serialised"]
        assert first_done >= 0.030 and second_done >= 0.060
        assert result["bandwidth"] >= 0.025


def test_random_preset_shards_are_slices_of_the_full_init():
    full = load_tp_model("tiny", tp_rank=0, tp_size=1, residual="ladder", vocab_size=64)
    shards = [load_tp_model("tiny", tp_rank=r, tp_size=2, residual="ladder", vocab_size=64) for r in range(2)]
    for name, param in full.named_parameters():
        local = [dict(s.named_parameters())[name] for s in shards]
        if name.endswith(("wo.weight", "w_down.weight")):
            assert torch.equal(torch.cat(local, dim=1), param), name
        elif name.endswith(("wq.weight", "wk.weight", "wv.weight", "w_gate.weight", "w_up.weight")):
            assert torch.equal(torch.cat(local, dim=0), param), name
        else:
            assert torch.equal(local[0], param) and torch.equal(local[1], param), name
    # the same weights as the model's own init from the same seed
    torch.manual_seed(0)
    with torch.device("meta"):
        reference = Transformer(full.args)
    reference.to_empty(device="cpu")
    reference.init_weights()
    for (name, a), b in zip(reference.state_dict().items(), full.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_tp_degree_not_dividing_heads_fails_before_loading(tmp_path, capsys):
    with pytest.raises(ValueError, match="tensor-parallel degree 3 does not divide n_heads=4"):
        load_tp_model("tiny", tp_rank=0, tp_size=3)
    path = make_export(tmp_path, "gqa", "standard", None)  # 4 heads, 2 kv heads
    with pytest.raises(ValueError, match="degree 4 does not divide n_kv_heads=2"):
        load_tp_model(path, tp_rank=0, tp_size=4)
    capsys.readouterr()
    assert bench_main(["--model", "tiny", "--tp", "3"]) == 2
    assert capsys.readouterr().err == "ladder-bench: error: tiny: tensor-parallel degree 3 does not divide n_heads=4\n"
    assert bench_main(["--model", "tiny", "--layouts", "standard,lader"]) == 2
    assert "ladder-bench: error: --layouts 'standard,lader'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="neither a model preset"):
        load_tp_model(tmp_path / "missing")
    torn = tmp_path / "checkpoints" / "step-8"
    torn.mkdir(parents=True)
    (torn / ".metadata").write_bytes(b"")  # DCP wrote its files but the save never completed
    with pytest.raises(ValueError, match="step-8: not a complete checkpoint"):
        load_tp_model(torn)


def test_sampling_greedy_and_top_k():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]]).repeat(500, 1)
    assert torch.equal(sample(logits), torch.full((500,), 1))
    drawn = sample(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}  # only the two best, and both of them


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


def test_latency_note_compares_x_with_the_shorter_module():
    below = latency_note(20.0, {"attention": 30.0, "mlp": 31.0})
    assert below.startswith("Emulated X = 20 ms is 0.67x the shorter module's") and "overlap can hide it all" in below
    above = latency_note(90.0, {"attention": 31.0, "mlp": 29.0})
    # the serialised link is busy 90 ms per all-reduce: at best (30 + 90) / 90 per module
    assert "3.1x" in above and "bounded near 1 + c/X = 1.33x" in above


def test_bench_refuses_a_damaged_checkpoint_in_one_line(tmp_path, capsys):
    path = make_checkpoint(tmp_path / "run", "ladder", None)
    shard = max(path.glob("*.distcp"), key=lambda f: f.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # one flipped bit in the weights
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert bench_main(["--model", str(path), "--gen-len", "2", "--prompt-len", "2"]) == 1  # a RunFailed
    message = capsys.readouterr().err
    assert message.startswith(f"ladder-bench: error: {path}") and message.count("\n") == 1
