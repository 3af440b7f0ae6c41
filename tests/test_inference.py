"""Tensor-parallel inference (``ladder_train.inference``), on CPU/gloo: TP = 2 gives the single-process logits and
tokens for every layout, loaded from exports and training checkpoints; the ladder's async (and delayed) all-reduce
changes timing, never values; TP above the kv-head count replicates each kv head. The compiled path and sampling:
tests/test_inference_compiled.py; the GPU's decode step: tests/test_inference_gpu_step.py; ladder-generate and the
Generator's stop at end-of-sequence: tests/test_completion.py."""

import os
import time

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks, save_training_checkpoint

from ladder_train.inference import Generator, TPCommunicator, comm_mode_for, load_tp_model
from ladder_train.inference.tp import EmulatedLinkCommunicator
from ladder_train.loading import load_model, load_tp_shard
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export
from ladder_train.model.transformer import RMSNorm

SHAPE = dict(vocab_size=97, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
LAYOUTS = {"standard": ("standard", None), "parallel": ("parallel", None), "ladder": ("ladder", None)}
LAYOUTS["hybrid"] = ("ladder", 2)
PROMPT = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(1))
DECODE_STEPS = 8
LATENCY_MS = 2.0


def make_model(residual, ladder_layers, **shape):
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**{**SHAPE, **shape}, residual=residual, ladder_layers=ladder_layers))
    with torch.no_grad():  # norms start at ones; perturb them so a wrongly handled norm shows
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.uniform_(0.5, 1.5)
    return model


def make_export(root, name, residual, ladder_layers):
    return save_export(make_model(residual, ladder_layers), root / name)


def make_checkpoint(root, residual, ladder_layers):
    """The weights of ``make_export``, saved as a training checkpoint by the trainer's own Checkpointer."""
    return save_training_checkpoint(make_model(residual, ladder_layers), root)


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


def _worker(exports, out_dir):
    dist.init_process_group("gloo")  # from run_ranks's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, path in exports.items():
        model = load_tp_model(path, tp_rank=rank, tp_size=world)
        residual = model.args.residual
        installed = model.layers[0].comm
        ready = run_model(model)["cached"]  # as loaded: the communicator load_tp_model installed
        results[name] = run_model(model, TPCommunicator(comm_mode_for(residual)))
        results[name]["ready"] = (type(installed).__name__, installed.mode, ready)
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
    run_ranks(_worker, 2, sources, str(root))
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
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_tp_rank_loads_ready_with_its_layouts_all_reduce_installed(tp_run, layout):
    ranks, reference = tp_run
    mode = "async" if LAYOUTS[layout][0] == "ladder" else "sync"
    for result in ranks:
        kind, installed_mode, logits = result[layout]["ready"]
        assert (kind, installed_mode) == ("TPCommunicator", mode)
        torch.testing.assert_close(logits, reference[layout]["cached"], atol=1e-5, rtol=1e-5)


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
        # a full recompute and the cached decode sum in other orders: fp32 rounding grows with the logits (the desync
        # test saw 1.4e-5 at logits up to ~8), so the bound scales with them; a wrong cache position is off by far more
        atol = 1e-5 * max(1.0, result[layout]["cached"].abs().max().item())
        torch.testing.assert_close(result[layout]["cached"], result[layout]["recompute"], atol=atol, rtol=1e-5)


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
    as on one NCCL stream (not both at 30 ms, as overlapping delays would give)."""
    ranks, _ = tp_run
    for result in ranks:
        first_done, second_done = result["serialised"]
        assert first_done >= 0.030 and second_done >= 0.060
        assert result["bandwidth"] >= 0.025


def test_random_preset_shards_are_slices_of_the_full_init():
    full = load_tp_shard("tiny", tp_rank=0, tp_size=1, residual="ladder", vocab_size=64)
    shards = [load_tp_shard("tiny", tp_rank=r, tp_size=2, residual="ladder", vocab_size=64) for r in range(2)]
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


def test_tp_degree_not_dividing_heads_fails_before_loading(tmp_path):
    with pytest.raises(ValueError, match="tensor-parallel degree 3 does not divide n_heads=4"):
        load_tp_model("tiny", tp_rank=0, tp_size=3)
    with pytest.raises(ValueError, match="neither a model preset"):
        load_tp_model(tmp_path / "missing")
    torn = tmp_path / "checkpoints" / "step-8"
    torn.mkdir(parents=True)
    (torn / ".metadata").write_bytes(b"")  # DCP wrote its files but the save never completed
    with pytest.raises(ValueError, match="step-8: not a complete checkpoint"):
        load_tp_model(torn)


# TP above the kv-head count: each kv head replicated on tp / n_kv_heads ranks (as vLLM and SGLang do) -------------

REPLICATED_KV = {  # name -> (residual, n_kv_heads); n_heads = 4, run at TP 4
    "standard_kv2": ("standard", 2),
    "ladder_kv2": ("ladder", 2),
    "standard_kv1": ("standard", 1),
    "ladder_kv1": ("ladder", 1),
}


def _replicated_kv_worker(sources: dict) -> dict:
    dist.init_process_group("gloo")
    results = {}
    for name, path in sources.items():
        model = load_tp_model(path, tp_rank=dist.get_rank(), tp_size=dist.get_world_size())
        results[name] = run_model(model, TPCommunicator(comm_mode_for(model.args.residual)))
        results[name]["wk"] = [layer.attention.wk.weight.clone() for layer in model.layers]
        results[name]["wv"] = [layer.attention.wv.weight.clone() for layer in model.layers]
        results[name]["local_wq_rows"] = model.layers[0].attention.wq.weight.shape[0]
        model.setup_kv_cache(1, 4)
        results[name]["local_kv_cache_heads"] = model.layers[0].attention.kv_cache.k.shape[1]
    dist.destroy_process_group()
    return results


@pytest.fixture(scope="module")
def replicated_kv_run(tmp_path_factory):
    """Every TP = 4 result of 4-head models with 2 and 1 kv heads, from exports (and one training checkpoint),
    in one 4-process gloo run; plus the full models."""
    root = tmp_path_factory.mktemp("tp4")
    models = {name: make_model(residual, None, n_kv_heads=kv) for name, (residual, kv) in REPLICATED_KV.items()}
    sources = {name: str(save_export(model, root / name)) for name, model in models.items()}
    sources["ladder_kv2_checkpoint"] = str(save_training_checkpoint(models["ladder_kv2"], root / "run"))
    ranks = run_ranks(_replicated_kv_worker, 4, sources)
    full = {name: load_model(sources[name]).eval() for name in REPLICATED_KV}
    return ranks, full, {name: run_model(model) for name, model in full.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REPLICATED_KV))
def test_tp_above_the_kv_heads_gives_the_single_process_logits_and_tokens(replicated_kv_run, name):
    ranks, _, reference = replicated_kv_run
    for result in ranks:
        torch.testing.assert_close(result[name]["cached"], reference[name]["cached"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(result[name]["recompute"], reference[name]["recompute"], atol=1e-5, rtol=1e-5)
        assert torch.equal(result[name]["greedy"], reference[name]["greedy"])
        # one of 4 query heads (head dim 8) and one kv head, replicated: the cache holds 1 head per rank
        assert result[name]["local_wq_rows"] == 8 and result[name]["local_kv_cache_heads"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name, kv_head_of_rank", [("ladder_kv2", [0, 0, 1, 1]), ("standard_kv1", [0, 0, 0, 0])])
def test_tp_above_the_kv_heads_each_rank_holds_the_kv_head_of_its_query_head(replicated_kv_run, name, kv_head_of_rank):
    """Rank r holds query head r, which uses kv head r // (4 / n_kv_heads) in grouped-query attention."""
    ranks, full, _ = replicated_kv_run
    sources = [name, "ladder_kv2_checkpoint"] if name == "ladder_kv2" else [name]
    for rank, head in enumerate(kv_head_of_rank):
        for i, layer in enumerate(full[name].layers):
            rows = slice(head * 8, (head + 1) * 8)
            for source in sources:
                assert torch.equal(ranks[rank][source]["wk"][i], layer.attention.wk.weight[rows]), (rank, i, source)
                assert torch.equal(ranks[rank][source]["wv"][i], layer.attention.wv.weight[rows]), (rank, i, source)


@pytest.mark.slow
def test_tp_above_the_kv_heads_from_a_training_checkpoint(replicated_kv_run):
    ranks, _, reference = replicated_kv_run
    for result in ranks:
        got = result["ladder_kv2_checkpoint"]
        torch.testing.assert_close(got["cached"], reference["ladder_kv2"]["cached"], atol=1e-5, rtol=1e-5)
        assert torch.equal(got["greedy"], reference["ladder_kv2"]["greedy"])


def test_tp_degrees_that_cannot_shard_the_heads_are_refused_before_loading(tmp_path):
    cases = {  # (n_heads, n_kv_heads, dim) at TP 4 -> the one-line error
        (6, 2, 48): "tensor-parallel degree 4 does not divide n_heads=6",
        (12, 3, 48): "tensor-parallel degree 4 is above n_kv_heads=3 (n_heads=12) but not a multiple of it: "
        "the KV heads cannot be replicated evenly",
        (12, 6, 48): "tensor-parallel degree 4 does not divide n_kv_heads=6 (n_heads=12): "
        "the KV heads cannot be split evenly",
    }
    for (n_heads, n_kv_heads, dim), message in cases.items():
        model = make_model("ladder", None, dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads)
        path = save_export(model, tmp_path / f"h{n_heads}_kv{n_kv_heads}")
        with pytest.raises(ValueError) as err:
            load_tp_model(path, tp_rank=0, tp_size=4)
        assert str(err.value) == f"{path}: {message}"
