"""The compiled path (the GPU's, run on the CPU): the ``fullgraph=True`` prefill and decode with real functional
collectives over gloo at TP = 2, the ladder's overlap surviving inductor's scheduler, and the bf16 decode; and
sampling: greedy, top-k, the exponential race, drawn inside the compiled step.

The three layouts run with ``aot_eager`` (dynamo's full graph capture and AOT autograd's functionalisation of the
collectives, which is where a graph break or a host-side call would fail, compiled in seconds); the ladder runs once
more through inductor, the backend a GPU uses, because only inductor reorders and fuses kernels: there the test
reads the generated code for the order of all-reduces, waits and matmuls (~30 s of C++ compilation on 2 cores)."""

import re

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from test_inference import PROMPT, make_model

from ladder_train.inference import Generator, TPCommunicator, comm_mode_for, load_tp_model, next_tokens

COMPILED_SHAPE = dict(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
COMPILED_LAYOUTS = {"standard": None, "parallel": None, "ladder": None, "hybrid": 1}  # hybrid: ladder on the last 1
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
        # attention's all-reduce hides behind the whole MLP, the MLP's behind the whole next attention: two matrix
        # products each, as the generator joins Q, K, V and gate, up (Transformer.fuse_projections)
        assert in_flight[:-1] == [2] * (len(in_flight) - 1), in_flight
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


# sampling -------------------------------------------------------------------------------------------------------------


def test_sampling_greedy_and_top_k():
    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0, 1.0]]).repeat(500, 1)
    assert torch.equal(next_tokens(logits), torch.full((500,), 1))
    drawn = next_tokens(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {1, 2}  # only the two best, and both of them


@pytest.mark.slow  # compiles
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
