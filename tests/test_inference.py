"""Tensor-parallel inference and generation (``ladder_train.inference``), on CPU/gloo.

The TP model: TP = 2 gives the single-process logits and tokens for every layout, and the ladder's async (and
delayed) all-reduce changes timing, never values.

The compiled path (the GPU's, run on the CPU): the ``fullgraph=True`` prefill and decode with real functional
collectives over gloo at TP = 2, the ladder's overlap surviving inductor's scheduler, and the bf16 decode. The
three layouts run with ``aot_eager`` (dynamo's full graph capture and AOT autograd's functionalisation of the
collectives, which is where a graph break or a host-side call would fail, compiled in seconds); the ladder runs once
more through inductor, the backend a GPU uses, because only inductor reorders and fuses kernels: there the test
reads the generated code for the order of all-reduces, waits and matmuls (~30 s of C++ compilation on 2 cores).
The GPU's decode step is also checked without a GPU: on fake cuda tensors, one compiled-path step neither waits for
the GPU nor copies between host and device; and the KV cache is allocated once per shape and zeroed in place.
ladder-generate and the Generator's stop at end-of-sequence: tests/test_completion.py."""

import os
import re
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_utils import run_ranks, save_training_checkpoint

from ladder_train.inference import Generator, TPCommunicator, comm_mode_for, load_tp_model, next_tokens
from ladder_train.inference import generate as generate_module
from ladder_train.inference.tp import EmulatedLinkCommunicator
from ladder_train.loading import load_model, load_tp_shard
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


def _worker(rank, world, port, exports, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
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


def test_sampling_greedy_and_top_k():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]]).repeat(500, 1)
    assert torch.equal(next_tokens(logits), torch.full((500,), 1))
    drawn = next_tokens(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}  # only the two best, and both of them


# the compiled path ------------------------------------------------------------------------------------------

COMPILED_SHAPE = dict(vocab_size=97, dim=64, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
COMPILED_LAYOUTS = {"standard": None, "parallel": None, "ladder": None, "hybrid": 2}  # hybrid: ladder on the last 2
COMPILED_PROMPT = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(1))
COMPILED_NEW_TOKENS = 8


def load_tiny(layout: str, rank: int = 0, world: int = 1):
    residual = "ladder" if layout == "hybrid" else layout
    return load_tp_model(
        "tiny", rank, world, residual=residual, ladder_layers=COMPILED_LAYOUTS[layout], **COMPILED_SHAPE
    )


def graphs_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def in_gloo_group(fn, *args):
    """``fn(*args)`` inside a gloo process group made from the environment run_ranks sets."""
    dist.init_process_group("gloo")
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def _compiled_worker(backend: str, layouts: list[str]):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for layout in layouts:
        model = load_tiny(layout, rank, world)
        model.set_communicator(TPCommunicator(comm_mode_for(model.args.residual)))
        eager = Generator(model, dist.group.WORLD)
        compiled = Generator(model, dist.group.WORLD, compile=True, backend=backend)
        before = graphs_compiled()
        first = compiled.generate(COMPILED_PROMPT, COMPILED_NEW_TOKENS)
        after_first = graphs_compiled()
        second = compiled.generate(COMPILED_PROMPT, COMPILED_NEW_TOKENS)  # same shapes: no recompilation
        after_second = graphs_compiled()
        last = COMPILED_PROMPT[:, -1].contiguous()  # as sampled tokens are (a strided view would be a new guard)
        logits = {}
        for name, gen in (("compiled", compiled), ("eager", eager)):
            gen.setup(2, COMPILED_PROMPT.shape[1] + COMPILED_NEW_TOKENS)
            gen.prefill(COMPILED_PROMPT)
            logits[name] = gen.decode_step(last, COMPILED_PROMPT.shape[1])
        out[layout] = {
            "eager_tokens": eager.generate(COMPILED_PROMPT, COMPILED_NEW_TOKENS),
            "compiled_tokens": first,
            "second_tokens": second,
            "graphs_first": after_first - before,
            "graphs_total": after_second - before,
            "eager_logits": logits["eager"],
            "compiled_logits": logits["compiled"],
        }
    return out


@pytest.fixture(scope="module")
def references():
    return {
        layout: Generator(load_tiny(layout)).generate(COMPILED_PROMPT, COMPILED_NEW_TOKENS)
        for layout in COMPILED_LAYOUTS
    }


@pytest.mark.slow
def test_compiled_tp2_decode_gives_the_eager_and_tp1_tokens_for_every_layout(references):
    ranks = run_ranks(in_gloo_group, 2, _compiled_worker, "aot_eager", list(COMPILED_LAYOUTS))
    for result in ranks:
        for layout, r in result.items():
            assert torch.equal(r["compiled_tokens"], r["eager_tokens"]), layout
            assert torch.equal(r["compiled_tokens"], references[layout]), layout
            assert torch.equal(r["second_tokens"], r["compiled_tokens"]), layout
            torch.testing.assert_close(r["compiled_logits"], r["eager_logits"], atol=1e-5, rtol=1e-5)
            # one prefill graph and one decode graph, reused by every step and by the second generation
            assert r["graphs_first"] == 2 and r["graphs_total"] == 2, layout


def _inductor_schedule_worker():
    """The ladder's decode step through inductor: tokens, and the generated code of the step."""
    from torch._inductor.utils import run_and_get_code

    rank, world = dist.get_rank(), dist.get_world_size()
    model = load_tiny("ladder", rank, world)
    model.set_communicator(TPCommunicator("async"))
    gen = Generator(model, dist.group.WORLD, compile=True, backend="inductor")
    tokens = gen.generate(COMPILED_PROMPT, COMPILED_NEW_TOKENS)
    gen.setup(2, COMPILED_PROMPT.shape[1] + COMPILED_NEW_TOKENS)
    with torch.no_grad():
        _, code = run_and_get_code(gen._decode, COMPILED_PROMPT[:, -1:], torch.tensor(COMPILED_PROMPT.shape[1]))
    return tokens, code[-1]


def schedule(code: str) -> list[tuple[str, str | None]]:
    """The generated code's sequence of ("issue", buffer), ("wait", buffer) and ("matmul", None)."""
    events = []
    for line in code.splitlines():
        line = line.strip()
        if line.startswith("#"):
            continue
        if m := re.search(r"_c10d_functional\.all_reduce_?\.default\((?:reinterpret_tensor\()?(\w+)", line):
            events.append(("issue", m.group(1)))
        elif m := re.search(r"_c10d_functional\.wait_tensor\.default\((?:reinterpret_tensor\()?(\w+)", line):
            events.append(("wait", m.group(1)))
        elif re.search(r"extern_kernels\.(mm|addmm|bmm)\(", line):
            events.append(("matmul", None))
    return events


def matmuls_in_flight(events) -> list[int]:
    """For each all-reduce in issue order, the matmuls run between its issue and its wait."""
    counts = []
    for i, (kind, buf) in enumerate(events):
        if kind == "issue":
            end = next(j for j in range(i + 1, len(events)) if events[j] == ("wait", buf))
            counts.append(sum(1 for kind_, _ in events[i + 1 : end] if kind_ == "matmul"))
    return counts


@pytest.mark.slow
def test_inductor_keeps_every_ladder_all_reduce_in_flight_across_the_next_module(references):
    """Inductor by default waits right after each all-reduce and fuses the ladder's residual adds across
    modules; with the generator's scheduling passes and the ladder's fences, every all-reduce but the last
    (waited before the final norm) stays in flight across the next module's matmuls."""
    ranks = run_ranks(in_gloo_group, 2, _inductor_schedule_worker)
    for tokens, code in ranks:
        assert torch.equal(tokens, references["ladder"])
        in_flight = matmuls_in_flight(schedule(code))
        assert len(in_flight) == 2 * COMPILED_SHAPE["n_layers"]
        # attention's all-reduce hides behind the MLP (3 matmuls), the MLP's behind the next attention (4)
        assert all(n >= 3 for n in in_flight[:-1]), in_flight
        assert in_flight[-1] == 0


def test_schedule_parser_on_a_blocking_and_an_overlapped_sequence():
    code = "\n".join(
        [
            "extern_kernels.mm(buf1, arg2_1, out=buf3)",
            "torch.ops._c10d_functional.all_reduce_.default(buf3, 'sum', '0')",
            "# torch.ops._c10d_functional.wait_tensor.default(buf3) in a comment",
            "extern_kernels.mm(buf4, arg5_1, out=buf6)",
            "torch.ops._c10d_functional.all_reduce_.default(reinterpret_tensor(buf6, (2, 1, 64)), 'sum', '0')",
            "torch.ops._c10d_functional.wait_tensor.default(buf3)",
            "torch.ops._c10d_functional.wait_tensor.default(reinterpret_tensor(buf6, (2, 1, 64), (64, 64, 1), 0))",
        ]
    )
    events = schedule(code)
    assert events == [
        ("matmul", None),
        ("issue", "buf3"),
        ("matmul", None),
        ("issue", "buf6"),
        ("wait", "buf3"),
        ("wait", "buf6"),
    ]
    assert matmuls_in_flight(events) == [1, 0]


def test_bf16_decode_on_the_cpu_is_close_to_fp32():
    """bf16 keeps 8 bits of mantissa: each rounding is off by up to 2^-9 (0.2 %) relative. The logits pass
    a few dozen bf16 roundings (weights, activations, the residual adds of 3 layers, the cache) with fp32
    accumulation, norms in fp32 and logits upcast; measured: 0.26 % of the largest fp32 logit. We allow
    1 %, and the greedy token must agree wherever fp32's top-2 margin exceeds twice the error."""
    fp32 = load_tiny("ladder")
    bf16 = load_tiny("ladder")
    bf16.to(torch.bfloat16)
    logits = {}
    for name, model in (("fp32", fp32), ("bf16", bf16)):
        gen = Generator(model)
        gen.setup(2, COMPILED_PROMPT.shape[1] + 4)
        steps = [gen.prefill(COMPILED_PROMPT)]
        for i in range(3):
            steps.append(gen.decode_step(COMPILED_PROMPT[:, i], COMPILED_PROMPT.shape[1] + i))
        logits[name] = torch.stack(steps)
    assert logits["bf16"].dtype == torch.float32  # logits upcast in both
    assert bf16.layers[0].attention.kv_cache.k.dtype == torch.bfloat16
    error = (logits["bf16"] - logits["fp32"]).abs().max()
    scale = logits["fp32"].abs().max()
    assert 0 < error <= 0.01 * scale, (error, scale)
    top2 = logits["fp32"].topk(2, dim=-1).values
    decisive = (top2[..., 0] - top2[..., 1]) > 2 * error
    agree = logits["bf16"].argmax(-1) == logits["fp32"].argmax(-1)
    assert decisive.any() and agree[decisive].all()


# the GPU's decode step, checked on the CPU: fake cuda tensors --------------------------------------------------
# FakeTensorMode makes cuda tensors without a GPU (shapes and devices, no data). A CPU-only build lacks the cuda
# device guard that Python indexing and Tensor.copy_ take, so FakeCudaIndexing does those with aten ops.


def _aten_index(x: torch.Tensor, index) -> torch.Tensor:
    """``x[index]`` for None, Ellipsis, int, slice and 1-d tensor entries, with aten ops."""
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index):
        at = next(n for n, i in enumerate(index) if i is Ellipsis)
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        index = index[:at] + (slice(None),) * (x.dim() - used) + index[at + 1 :]
    dim = 0
    for i in index:
        if i is None:
            x, dim = x.unsqueeze(dim), dim + 1
        elif isinstance(i, slice):
            start, stop = 0 if i.start is None else i.start, 2**62 if i.stop is None else i.stop
            x, dim = torch.ops.aten.slice(x, dim, start, stop, i.step or 1), dim + 1
        elif isinstance(i, int):
            x = x.select(dim, i)
        elif isinstance(i, torch.Tensor) and i.dim() == 1:
            x, dim = x.index_select(dim, i), dim + 1
        else:
            raise NotImplementedError(f"fake cuda indexing by {i!r}")
    return x


class FakeCudaIndexing(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_cuda = args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda"
        if on_cuda and func is torch.Tensor.__getitem__:
            return _aten_index(*args)
        if on_cuda and func is torch.Tensor.__setitem__:
            target, value = _aten_index(args[0], args[1]), args[2]
            return torch.ops.aten.copy_(target, value) if isinstance(value, torch.Tensor) else target.fill_(value)
        if on_cuda and func is torch.Tensor.copy_:
            return torch.ops.aten.copy_(*args, **kwargs)
        return func(*args, **kwargs)


class HostTraffic(torch.utils._python_dispatch.TorchDispatchMode):
    """Records, once ``on``, every op that waits for the GPU or moves data between host and GPU."""

    def __init__(self):
        super().__init__()
        self.on, self.found = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func is torch.ops.aten._local_scalar_dense.default:
            self.found.append(f"{func} (host sync)")  # recorded first: a fake tensor has no value to give
        out = func(*args, **(kwargs or {}))
        if self.on:
            tensors = lambda tree: [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]  # noqa: E731
            inputs = {t.device.type for t in tensors((args, kwargs))}
            outputs = {t.device.type for t in tensors(out)}
            if "cuda" in inputs and "cpu" in outputs:
                self.found.append(f"{func} (device to host)")
            elif "cuda" in outputs and ("cpu" in inputs or func is torch.ops.aten.lift_fresh.default):
                self.found.append(f"{func} (host to device)")
        return out


def fake_cuda_model(residual: str) -> Transformer:
    """A tiny model whose parameters and buffers are fake cuda tensors (call inside FakeTensorMode)."""
    from ladder_train.model.transformer import build_on_meta

    model = build_on_meta(ModelArgs(**SHAPE, residual=residual))
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in list(store.items()):
                if tensor is not None:
                    fake = torch.empty(tensor.shape, dtype=tensor.dtype, device="cuda")
                    store[name] = torch.nn.Parameter(fake, requires_grad=False) if store is module._parameters else fake
    return model


@pytest.mark.parametrize("top_k", [None, 5], ids=["greedy", "top_k"])
def test_a_compiled_decode_step_on_cuda_never_waits_for_or_copies_from_the_host(monkeypatch, top_k):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real_generator = torch.Generator
    monkeypatch.setattr(torch, "Generator", lambda device=None: real_generator())  # no cuda generator on a CPU build
    # fake tensors cannot draw from a generator: the draw (a device kernel into the fixed buffer) goes unseeded
    monkeypatch.setattr(generate_module, "exponential_draws", lambda shape, generator, device, out: out.exponential_())
    traffic = HostTraffic()
    # force_eager: the compiled Generator's own code path, with its step functions run eagerly (dynamo cannot
    # trace fake cuda tensors on a CPU build); the prefill's H2D and syncs are not recorded, one decode step is
    with FakeTensorMode(), FakeCudaIndexing(), torch.compiler.set_stance("force_eager"):
        gen = Generator(fake_cuda_model("ladder"), compile=True)
        prompt = torch.zeros(2, 6, dtype=torch.long, device="cuda")
        with traffic:
            tokens = gen.generate(
                prompt,
                2,
                temperature=1.0 if top_k else 0.0,
                top_k=top_k,
                on_prefill_done=lambda: setattr(traffic, "on", True),
            )
    assert tokens.shape == (2, 2) and tokens.device.type == "cuda"
    assert traffic.on and traffic.found == [], traffic.found


def test_the_host_traffic_record_sees_syncs_and_copies():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), FakeCudaIndexing():
        x = torch.zeros(3, device="cuda")
        traffic = HostTraffic()
        with traffic:
            traffic.on = True
            with pytest.raises(Exception, match="_local_scalar_dense"):  # a fake tensor has no value
                x.sum().item()
            x.cpu()
            torch.tensor(7, device="cuda")
            x[1:].add_(1)  # on the device: not recorded
    assert [found.split(" ", 1)[1] for found in traffic.found] == [
        "(host sync)",
        "(device to host)",
        "(host to device)",
    ]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled_path"])
def test_the_kv_cache_is_allocated_once_per_shape_and_zeroed_between_generations(compiled):
    """The same cache tensors across generations of one shape (a CUDA graph keeps their addresses), zeroed in
    place: NaN left in them changes nothing. ``compiled_path``: the compiled Generator's code (a device position,
    the whole masked cache read each step, where NaN would spread), its steps run eagerly."""
    model = make_model("ladder", None)
    gen = Generator(model, compile=compiled)
    with torch.compiler.set_stance("force_eager"):
        first = gen.generate(PROMPT, 10)
        caches = [(cache.k, cache.v) for cache in model.kv_caches()]
        for k, v in caches:
            k.fill_(float("nan")), v.fill_(float("nan"))
        again = gen.generate(PROMPT, 10)
        sampled = [gen.generate(PROMPT, 10, temperature=1.0, top_k=5, seed=3) for _ in range(2)]
        assert all(cache.k is k and cache.v is v for cache, (k, v) in zip(model.kv_caches(), caches, strict=True))
        gen.generate(PROMPT[:1], 10)  # another batch size: a cache of its own shape
        assert model.kv_caches()[0].k.shape[0] == 1
    assert torch.equal(again, first) and torch.equal(sampled[1], sampled[0])
    assert torch.equal(first, Generator(make_model("ladder", None)).generate(PROMPT, 10))


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


def test_compiled_sampling_chooses_inside_the_step_and_draws_the_eager_tokens():
    """Top-k sampling runs inside the compiled step (the Exp(1) draws of the seeded generator enter as one fixed
    buffer): the same seed gives the eager tokens, another seed others, and every token is one of the top k."""
    model = make_model("ladder", None)
    eager = Generator(model).generate(PROMPT, 8, temperature=1.0, top_k=3, seed=11)
    compiled = Generator(model, compile=True, backend="aot_eager")
    first = compiled.generate(PROMPT, 8, temperature=1.0, top_k=3, seed=11)
    buffer = compiled._noise
    assert torch.equal(first, eager)
    assert torch.equal(compiled.generate(PROMPT, 8, temperature=1.0, top_k=3, seed=11), eager)
    assert compiled._noise is buffer  # one buffer for every step and generation of this batch size
    assert not torch.equal(compiled.generate(PROMPT, 8, temperature=1.0, top_k=3, seed=12), eager)
    greedy = Generator(model).generate(PROMPT, 8)
    assert not torch.equal(eager, greedy)  # a sample, not the argmax
    # each sampled token is among the top 3 of the logits after the tokens before it
    with torch.no_grad():
        logits = model(torch.cat([PROMPT, eager[:, :-1]], dim=1))[:, PROMPT.shape[1] - 1 :]
    top3 = logits.topk(3, dim=-1).indices
    assert (top3 == eager[..., None]).any(-1).all()


def test_the_exponential_race_samples_the_softmax():
    """argmax(p / E) with E ~ Exp(1) draws token i with probability p_i (20,000 draws, within 4 sd)."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -9.0]]).repeat(20000, 1)
    drawn = next_tokens(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(logits[0], -1)
    share = torch.bincount(drawn, minlength=4) / 20000
    assert (share - p).abs().max() < 4 * (p * (1 - p) / 20000).sqrt().max()
