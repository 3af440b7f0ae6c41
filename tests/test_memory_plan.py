"""The memory plan (train/memory_plan.py) against what a step holds: each block's saved tensors against autograd's own
record, the whole plan against the peak of a real training step on fake tensors (the real model, FSDP, optimizer and
micro-batch loop; shapes and storages, no arithmetic), and against the peaks measured on an H200 (docs/results/gpu/)."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ladder_train.config import load_config, model_args
from ladder_train.model import ModelArgs, count_params
from ladder_train.train.memory_plan import GIB, block_bytes_per_token, memory_plan

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "results" / "gpu" / "h100_2026-11-26_by_hand.jsonl"
H200_ROWS = ROOT / "docs" / "results" / "gpu" / "h200_2026-11-28.jsonl"
SHARED_LOGS = ROOT.parent / "shared" / "gpu" / "2026-11-26"


def saved_bytes(block: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for the block's backward, its weights and the rope tables
    aside."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, cos, sin)
    fixed = {t.untyped_storage().data_ptr() for t in [*block.parameters(), cos, sin]}
    return sum(n for ptr, n in saved.items() if ptr not in fixed)


def bf16_block(layout: str, dim: int = 192, heads: int = 3, ffn: int = 512, seq: int = 64):
    from ladder_train.model.modules import rope_tables
    from ladder_train.model.transformer import Block

    args = ModelArgs(vocab_size=256, dim=dim, n_layers=2, n_heads=heads, ffn_dim=ffn, max_seq_len=seq, residual=layout)
    torch.manual_seed(0)
    block = Block(args, layout).to(torch.bfloat16)
    x = torch.randn(1, seq, dim, dtype=torch.bfloat16, requires_grad=True)
    return args, block, x, *rope_tables(args.head_dim, seq, 10000.0)


@pytest.mark.parametrize("layout", ["standard", "parallel", "ladder"])
def test_an_eager_block_saves_what_the_plan_counts(layout):
    args, block, x, cos, sin = bf16_block(layout)
    assert saved_bytes(block, x, cos, sin) == x.shape[1] * block_bytes_per_token(args, layout, compiled=False)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
@pytest.mark.parametrize("stream_input", [False, True], ids=["one stream in", "two streams in"])
@pytest.mark.parametrize("reduces", [(False, True), (True, True), (False, False)])
def test_a_desync_block_saves_what_the_plan_counts(stream_input, reduces, compiled):
    """Two emulated streams (t = 2 of 3 KV heads): a module whose input is still two streams normalises both."""
    from functorch.compile import aot_module, make_boxed_func, min_cut_rematerialization_partition

    from ladder_train.model.desync import DesyncBlock
    from ladder_train.model.modules import rope_tables

    def no_codegen(graph, inputs):
        return make_boxed_func(graph.forward)

    shape = dict(vocab_size=256, dim=192, n_layers=2, n_heads=6, n_kv_heads=3, ffn_dim=512, max_seq_len=64)
    args = ModelArgs(**shape, residual="desync", desync_tp=2)
    torch.manual_seed(0)
    block = DesyncBlock(args, reduces).to(torch.bfloat16)
    if compiled:
        block = aot_module(block, no_codegen, no_codegen, partition_fn=min_cut_rematerialization_partition)
    x = torch.randn(*((2,) if stream_input else ()), 1, 64, 192, dtype=torch.bfloat16, requires_grad=True)
    planned = block_bytes_per_token(args, "desync", compiled, (stream_input, not reduces[0]))
    assert saved_bytes(block, x, *rope_tables(args.head_dim, 64, 10000.0)) == 64 * planned
    if reduces == (True, True) and not stream_input:  # every input one stream: a standard block's bytes
        assert planned == block_bytes_per_token(ModelArgs(**shape), "standard", compiled)


@pytest.mark.slow  # traces with AOT autograd
def test_a_compiled_block_saves_what_the_plan_counts():
    # inductor's min-cut partitioner, run without generating code; it keeps one h-sized tensor and one rsqrt less in
    # a ladder or parallel block than in a standard one, the plan counts the standard's for every layout (the H100
    # peaks of the standard and the ladder 1.2B were 28.84 and 28.83 GiB)
    from functorch.compile import aot_module, make_boxed_func, min_cut_rematerialization_partition

    def no_codegen(graph, inputs):
        return make_boxed_func(graph.forward)

    args, block, x, cos, sin = bf16_block("standard")
    compiled = aot_module(block, no_codegen, no_codegen, partition_fn=min_cut_rematerialization_partition)
    assert saved_bytes(compiled, x, cos, sin) == x.shape[1] * block_bytes_per_token(args, "standard", compiled=True)


# inductor's CPU code generation imports a torch.jit decorator that torch 2.13 deprecates: nothing here to act on
@pytest.mark.slow  # compiles
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_loss_keeps_the_bf16_logits_and_writes_their_gradient_over_them():
    """inductor's code for model.TokenLoss, generated on the CPU: the forward allocates the logits once, in bf16,
    and autograd keeps them with two fp32 statistics a row, what the plan counts; the backward allocates nothing of
    the logits' size (it writes their gradient over them). Loss and gradients are eager's."""
    from torch._inductor.utils import run_and_get_code

    from ladder_train.model import TokenLoss
    from ladder_train.train.memory_plan import activation_bytes

    micro, seq, vocab, dim = 2, 64, 1000, 32
    shape = {"vocab_size": vocab, "dim": dim, "n_layers": 1, "n_heads": 2, "ffn_dim": 64, "max_seq_len": seq}
    cfg = load_config(None, [f"model.{k}={v}" for k, v in shape.items()] + [f"data.seq_len={seq}"])
    cfg.parallel.compile = True
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(micro, seq, dim, generator=gen).bfloat16().requires_grad_()
    head = (torch.randn(vocab, dim, generator=gen) / dim**0.5).bfloat16().requires_grad_()
    labels = torch.randint(0, vocab, (micro, seq), generator=gen)
    labels[0, :7] = -100
    compiled = TokenLoss()
    compiled.compile(fullgraph=True)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def step():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = compiled(h, head, labels)
        loss.backward()
        return loss

    loss, (forward, backward) = run_and_get_code(step)
    grads = h.grad.clone(), head.grad.clone()
    h.grad = head.grad = None
    kept = sum(n for ptr, n in saved.items() if ptr not in {h.data_ptr(), head.data_ptr(), labels.data_ptr()})
    assert kept == activation_bytes(cfg, micro)["logits"] == micro * seq * (2 * vocab + 8)
    full = re.compile(rf"empty_strided_cpu\(\({micro * seq}, {vocab}\), \(\d+, \d+\), (torch\.\w+)\)")
    assert full.findall(forward) == ["torch.bfloat16"] and full.findall(backward) == []
    eager = TokenLoss()(h, head, labels)
    eager.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=0)
    for got, want in zip(grads, (h.grad, head.grad), strict=True):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)


class LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes of the live storages and their peak: each op's outputs counted once per storage until it is freed, and
    the resize_ with which FSDP gathers and frees its unsharded parameters (a storage method, not an op)."""

    def __init__(self, fake_mode, tensors):
        super().__init__()
        self.fake_mode, self.live, self.current, self.peak = fake_mode, {}, 0, 0
        for t in tensors:
            self.count(t.to_local() if hasattr(t, "to_local") else t)

    def count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = id(storage), storage.nbytes()
        known = self.live.get(key)
        if known is not None and known[0]() is storage:
            self.current += size - known[1]
        else:
            self.current += size
            weakref.finalize(storage, self.forget, key)
        self.live[key] = (weakref.ref(storage), size)
        self.peak = max(self.peak, self.current)

    def forget(self, key: int) -> None:
        self.current -= self.live.pop(key)[1]

    def __enter__(self):
        resize, tracker = torch.UntypedStorage.resize_, self

        def counted_resize(storage, size):
            resize(storage, size)
            if id(storage) in tracker.live:
                tracker.count(torch.empty(0, device=storage.device).set_(storage))

        self._resize, torch.UntypedStorage.resize_ = resize, counted_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._guards import active_fake_mode
        from torch.distributed.tensor import DTensor

        if DTensor in types:
            return NotImplemented  # counted once DTensor has run the op on the local tensors
        out = func(*args, **(kwargs or {}))
        if active_fake_mode() is self.fake_mode:  # not DTensor's shape propagation
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.count(t)
        return out


def tracked_peak(cfg, accumulate: str) -> tuple[float, int]:
    """(peak bytes of a step's micro-batches, local parameters): the trainer's parallelize and micro-batch loop on one
    rank of a fake process group, every tensor fake, AdamW's state made before by a step on zero gradients. The
    optimizer step is not counted: on a GPU it is the fused AdamW, in place (the CPU's runs a loop of its own). The
    fake tensors are on the CPU: FSDP2 on cuda needs CUDA streams, which a CPU-only build lacks; the ops are the
    GPU's (flash attention keeps the same tensors on both)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ladder_train.model import build_on_meta
    from ladder_train.parallel import build_mesh, parallelize
    from ladder_train.train.optim import build_optimizer
    from ladder_train.train.step import accumulate_gradients

    micro, seq = cfg.train.micro_batch_size, cfg.data.seq_len
    accumulation = cfg.train.global_batch_size // micro
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        parallel = dataclasses.replace(cfg.parallel, accumulate=accumulate)
        model, plan = parallelize(
            build_on_meta(model_args(cfg.model)), parallel, build_mesh("cpu", 1, 1), torch.bfloat16
        )
        with FakeTensorMode(allow_non_fake_inputs=True) as fake:  # the model's meta tensors go in
            model.to_empty(device="cpu")
            model.init_rope()
            optimizer = build_optimizer(model, cfg.train.optimizer)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            moments = [t for state in optimizer.state.values() for t in state.values()]
            tracker = LiveBytes(fake, [*model.parameters(), *model.buffers(), *moments])
            batch = (torch.zeros(micro, seq, dtype=torch.long), torch.zeros(micro, seq, dtype=torch.long))
            with tracker:
                accumulate_gradients(model, lambda: batch, accumulation, 1.0, torch.device("cpu"), plan)
        return tracker.peak, sum(p.to_local().numel() for p in model.parameters())
    finally:
        dist.destroy_process_group()


def small_run(layout: str, checkpointing: str, micro: int = 4, accumulation: int = 2, units: int = 1, layers: int = 2):
    # fake tensors cost the same at any size: long sequences make the activations and the loss most of the peak
    shape = {"vocab_size": 8192, "dim": 512, "n_layers": layers, "n_heads": 8, "ffn_dim": 1376, "max_seq_len": 2048}
    overrides = {f"model.{k}": v for k, v in shape.items()} | {
        "parallel.blocks_per_fsdp_unit": units,
        "model.residual": layout,
        "data.seq_len": 2048,
        "train.micro_batch_size": micro,
        "train.global_batch_size": micro * accumulation,
        "parallel.activation_checkpoint": checkpointing,
        "parallel.compile": "false",
    }
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.parametrize(
    "layout, checkpointing, accumulate, units",
    [
        ("standard", "none", "sharded", 1),
        ("ladder", "none", "unsharded", 1),
        ("parallel", "selective", "sharded", 1),
        ("ladder", "full", "sharded", 1),
        ("ladder", "full", "sharded", 2),  # 4 blocks in units of 2: two units gathered at the backward's start
    ],
)
def test_the_plan_is_within_5_percent_of_a_fake_training_steps_peak(layout, checkpointing, accumulate, units):
    cfg = small_run(layout, checkpointing, units=units, layers=2 * units)
    peak, local = tracked_peak(cfg, accumulate)
    plan = memory_plan(cfg, model_args(cfg.model), local, 4, torch.device("cuda"), accumulation=2)
    planned = plan.unsharded if accumulate == "unsharded" else plan.sharded
    assert abs(planned - peak) / peak < 0.05, f"plan {planned / 2**20:.1f} MiB, tracked {peak / 2**20:.1f} MiB"


def test_sharded_accumulation_plans_two_units_of_blocks_gathered():
    """The current unit and the prefetched one: each block more per unit adds two blocks' bf16 parameters, up to
    the model's blocks (k = 5 of 8 layers: units of 5 and 3; k >= 8: one unit)."""
    plans = {units: plan_of(small_run("standard", "none", units=units, layers=8)) for units in (1, 4, 5, 8, 16)}
    args = model_args(small_run("standard", "none", layers=8).model)
    block_bytes = 2 * (count_params(args)["non_embedding"] - args.dim) / args.n_layers
    assert plans[4].gathered - plans[1].gathered == pytest.approx(2 * 3 * block_bytes)
    assert plans[4].sharded - plans[1].sharded == pytest.approx(2 * 3 * block_bytes)
    for units in (5, 8, 16):  # a unit holds at most the model's blocks, two units together too
        assert plans[units].gathered - plans[1].gathered == pytest.approx((8 - 2) * block_bytes)
    assert plans[16].unsharded == plans[1].unsharded  # kept unsharded, every block is gathered anyway


def plan_of(cfg):
    return memory_plan(cfg, model_args(cfg.model), 10**8, 4, torch.device("cuda"), accumulation=2)


def measured_rows() -> list[dict]:
    return [json.loads(line) for line in MEASURED.read_text().splitlines() if line.strip()]


def h200_training_rows() -> list[tuple[dict, str, list[str]]]:
    """The H200's training rows that ran to their end with no variant: (row, recipe, overrides of its command)."""
    rows = []
    for line in H200_ROWS.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "train" and not row["variant"] and not row["error"]:
            words = shlex.split(row["command"])
            at = words.index("--config")
            local = ("data.source=", "data.tokenizer=", "run.dir=")  # the card's paths: not the plan's concern
            overrides = [w for w in words[at + 2 :] if "=" in w and not w.startswith(local)]
            rows.append((row, words[at + 1], overrides))
    return rows


def test_the_plan_of_each_h200_rows_command_is_its_recorded_plan_and_within_4_percent_of_its_peak():
    rows = h200_training_rows()
    assert sorted((row["layout"], row["micro_batch"]) for row, _, _ in rows) == [
        ("ladder", 8),
        ("parallel", 8),
        ("standard", 2),
        ("standard", 8),
    ]
    for row, recipe, overrides in rows:
        cfg = load_config(ROOT / recipe, overrides)
        args = model_args(cfg.model)
        micro = cfg.train.micro_batch_size
        plan = memory_plan(
            cfg, args, count_params(args)["total"], micro, torch.device("cuda"), cfg.train.global_batch_size // micro
        )
        total = getattr(plan, row["plan_accumulation"]) / GIB
        assert round(total, 2) == row["plan_total_gib"], (row["layout"], micro)
        assert -0.01 < (total - row["peak_mem_gib"]) / row["peak_mem_gib"] < 0.035, (row["layout"], micro, total)


@pytest.mark.skipif(not SHARED_LOGS.is_dir(), reason="the logs of 2026-11-26 (../shared/gpu/) are not here")
def test_the_committed_h100_peaks_are_those_of_the_logs():
    for row in measured_rows():
        log = (SHARED_LOGS / row["source"]).read_text()
        peaks = {float(m) for m in re.findall(r"mem ([0-9.]+) GiB", log.split(row["log_section"])[1].split("rc=")[0])}
        assert max(peaks) == row["peak_mem_gib"], row["run"]


def test_the_dry_run_json_holds_the_figures_its_text_prints(capsys):
    """``--dry-run --json``: the plan as one JSON line (benchmarks read it), the same figures as the text."""
    from ladder_train.cli import main as ladder_train
    from ladder_train.train.memory_plan import dry_run, plan_summary

    recipe = ROOT / "recipes" / "ladder_3b.yaml"
    cfg = load_config(recipe)
    summary = plan_summary(cfg, "16x8", 80 * GIB)
    assert (summary["mesh"], summary["sharding"], summary["micro_batches"]) == ([16, 8], "HSDP", 4)
    assert summary["params"] == count_params(model_args(cfg.model))["total"]
    assert summary["largest_micro_batch"]["unsharded"]["micro_batch"] == 4
    text = dry_run(cfg, "16x8", 80 * GIB)
    assert f"| total {summary['memory_gib']['sharded']:.2f}\n" in text
    assert f"total {summary['memory_gib']['unsharded']:.2f} (parallel.accumulate=auto" in text
    assert ladder_train(["--config", str(recipe), "--dry-run", "--simulate", "16x8", "--json"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and json.loads(printed[0]) == summary


def test_the_dry_run_says_what_auto_chooses_on_the_planned_card(capsys):
    """parallel.accumulate=auto: the text and the JSON give the choice the run would make on a --gpu-memory card
    (the run's own rule, asked through parallelize), not 'auto'; the 3B ladder's unsharded plan (53.6 GiB at 16 x 8)
    fits an 80 GiB card and not a 40 GiB one."""
    from ladder_train.cli import main as ladder_train
    from ladder_train.train.memory_plan import plan_summary, plan_text

    cfg = load_config(ROOT / "recipes" / "ladder_3b.yaml")
    for gib, choice, verdict in ((80, "unsharded", "fits"), (40, "sharded", "does not fit")):
        summary = plan_summary(cfg, "16x8", gib * GIB)
        assert (summary["accumulate"], summary["accumulate_setting"]) == (choice, "auto")
        assert f"53.6 GiB, {verdict} 90 % of the device's {gib}.0 GiB" in summary["accumulate_reason"]
        assert f"(parallel.accumulate=auto: on a {gib} GiB GPU, {choice} (the plan with unsharded" in plan_text(summary)
        assert "auto keeps it" not in plan_text(summary)
    argv = ["--config", str(ROOT / "recipes" / "ladder_3b.yaml"), "--dry-run", "--simulate", "16x8", "--json"]
    assert ladder_train([*argv, "--gpu-memory", "40"]) == 0
    assert json.loads(capsys.readouterr().out)["accumulate"] == "sharded"
    fixed = plan_summary(
        load_config(ROOT / "recipes" / "ladder_3b.yaml", ["parallel.accumulate=unsharded"]), "16x8", 40 * GIB
    )
    assert (fixed["accumulate"], fixed["accumulate_setting"]) == ("unsharded", "unsharded")  # set, not chosen
    assert "(parallel.accumulate=unsharded)" in plan_text(fixed)


def test_a_plan_refused_for_the_assumed_world_says_which_world_and_whence(capsys, monkeypatch):
    """Without --simulate the dry run plans for SLURM_NNODES x GPUS_PER_NODE (1 x 8 unset): a refusal says so."""
    from cli_errors import assert_bad_input

    monkeypatch.delenv("SLURM_NNODES", raising=False)
    monkeypatch.delenv("GPUS_PER_NODE", raising=False)
    argv = ["--config", str(ROOT / "recipes" / "ladder_3b.yaml"), "--dry-run", "train.global_batch_size=12"]
    named = ("x 8 data-parallel ranks", "assumes 1 node(s) x 8 GPUs", "SLURM_NNODES unset: 1", "GPUS_PER_NODE unset: 8")
    assert_bad_input("ladder-train", argv, (*named, "--simulate NODESxGPUS plans another"), capsys, monkeypatch)
    monkeypatch.setenv("SLURM_NNODES", "2")
    assert_bad_input("ladder-train", argv, ("x 16 data-parallel ranks", "SLURM_NNODES=2"), capsys, monkeypatch)
    assert_bad_input(
        "ladder-train", [*argv, "--simulate", "3x8"], "assumes 3 node(s) x 8 GPUs: --simulate 3x8", capsys, monkeypatch
    )
    from ladder_train.train.memory_plan import plan_summary

    summary = plan_summary(load_config(ROOT / "recipes" / "ladder_3b.yaml"), None)
    assert summary["world_from"] == "SLURM_NNODES=2, GPUS_PER_NODE unset: 8" and summary["nodes"] == 2
