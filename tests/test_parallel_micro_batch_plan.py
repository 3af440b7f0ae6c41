"""parallel.MicroBatchPlan: what FSDP does around each micro-batch, decided once by parallelize and asked by the
micro-batch loop."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from tiny import tiny_run_config

from ladder_train.config import model_args
from ladder_train.model import build_on_meta
from ladder_train.parallel import MicroBatchPlan, build_mesh, parallelize


class Switches:
    """Records FSDP's per-micro-batch setters as (micro-batch, setter, value)."""

    def __init__(self):
        self.calls, self.micro = [], None

    def __getattr__(self, name):
        if not name.startswith("set_"):
            raise AttributeError(name)
        return lambda value: self.calls.append((self.micro, name, value))


def switches_over(plan_of, n: int) -> list[tuple]:
    switches = Switches()
    plan = plan_of(switches)
    for micro in range(n):
        switches.micro = micro
        plan.before(micro, n)
    return switches.calls


def test_unsharded_under_hsdp_gathers_with_the_first_micro_batch_and_reduces_with_the_last():
    calls = switches_over(lambda m: MicroBatchPlan(m, "unsharded", "test", replicate=2), 4)
    first = [(0, "set_requires_all_reduce", False), (0, "set_requires_gradient_sync", False)]
    first.append((0, "set_reshard_after_backward", False))
    last = [(3, "set_requires_all_reduce", True), (3, "set_requires_gradient_sync", True)]
    last.append((3, "set_reshard_after_backward", True))
    assert calls == first + last  # nothing set in the middle micro-batches: each setter walks every module
    # one micro-batch is both the first and the last: it reduces
    assert switches_over(lambda m: MicroBatchPlan(m, "unsharded", "test"), 1) == [
        (0, "set_requires_gradient_sync", True),
        (0, "set_reshard_after_backward", True),
    ]


def test_sharded_touches_only_the_replicas_all_reduce_and_no_fsdp_touches_nothing():
    calls = switches_over(lambda m: MicroBatchPlan(m, "sharded", "test", replicate=2), 3)
    assert calls == [(0, "set_requires_all_reduce", False), (2, "set_requires_all_reduce", True)]
    assert switches_over(lambda m: MicroBatchPlan(m, "sharded", "test"), 3) == []
    assert switches_over(lambda m: MicroBatchPlan(m, "none", "test", replicate=2), 3) == []


def test_the_plan_says_what_the_run_prints_about_its_gradients():
    assert MicroBatchPlan(None, "none", "not sharded").describe() is None
    assert MicroBatchPlan(None, "unsharded", "auto, on the CPU").describe() == (
        "FSDP gradients: unsharded (one gather and one reduction per step; auto, on the CPU)"
    )
    assert MicroBatchPlan(None, "sharded", "parallel.accumulate=sharded").describe() == (
        "FSDP gradients: sharded (per micro-batch; parallel.accumulate=sharded)"
    )


@pytest.mark.parametrize(
    ("setting", "fits", "dtype", "expected"),
    [
        ("auto", (True, "fits"), torch.bfloat16, ("unsharded", "fits")),
        ("auto", (False, "too big"), torch.bfloat16, ("sharded", "too big")),
        ("sharded", (True, "fits"), torch.bfloat16, ("sharded", "parallel.accumulate=sharded")),
        ("auto", (True, "fits"), torch.float32, ("none", "not sharded (one fp32 process)")),
    ],
)
def test_parallelize_decides_the_accumulation_once_from_the_memory_plan(setting, fits, dtype, expected, tmp_path):
    """auto asks the memory plan's answer with this rank's local parameter count; one fp32 process has no FSDP."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cfg = tiny_run_config(str(tmp_path), 256, 16)
    asked = []
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        parallel = dataclasses.replace(cfg.parallel, accumulate=setting)
        model = build_on_meta(model_args(cfg.model))
        params = sum(p.numel() for p in model.parameters())
        _, plan = parallelize(model, parallel, build_mesh("cpu", 1, 1), dtype, lambda n: asked.append(n) or fits)
    finally:
        dist.destroy_process_group()
    assert (plan.accumulate, plan.reason) == expected
    assert asked == ([params] if setting == "auto" and dtype == torch.bfloat16 else [])
