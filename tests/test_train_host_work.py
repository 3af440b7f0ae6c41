"""The host's work in a step's micro-batches (train/step.py's accumulate_gradients, the loop the trainer runs): the
ops it dispatches per micro-batch, and no wait for the GPU inside the loop (on the meta device, which stands in for
it)."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.distributed as dist
from tiny import tiny_run_config

from ladder_train.config import model_args
from ladder_train.model import build_on_meta
from ladder_train.train.step import accumulate_gradients

MICRO, SEQ, ACCUMULATION = 2, 16, 3


class OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Every op the host dispatches, by name, in order."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def ops_per_micro_batch(accumulate: str, tmp) -> tuple[list[collections.Counter], int]:
    """(the ops of each micro-batch of the second step, the parameters) (the first one also sets FSDP up): the tiny ladder, sharded in
    bf16 by the trainer's parallelize on one rank of a fake process group, on the CPU, eager."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ladder_train.parallel import build_mesh, init_sharded_weights, parallelize

    cfg = tiny_run_config(str(tmp), 256, SEQ)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        parallel = dataclasses.replace(cfg.parallel, accumulate=accumulate)
        model, plan = parallelize(
            build_on_meta(model_args(cfg.model)), parallel, build_mesh("cpu", 1, 1), torch.bfloat16
        )
        assert plan.accumulate == accumulate
        model.to_empty(device="cpu")
        init_sharded_weights(model, 0)
        batch = (torch.zeros(MICRO, SEQ, dtype=torch.long), torch.zeros(MICRO, SEQ, dtype=torch.long))
        counter, starts = OpCount(), []

        def next_batch():
            starts.append(len(counter.ops))
            return batch

        for _ in range(2):
            counter.ops.clear()
            starts.clear()
            with counter:
                accumulate_gradients(
                    model, next_batch, ACCUMULATION, MICRO * SEQ * ACCUMULATION, torch.device("cpu"), plan
                )
            model.zero_grad(set_to_none=True)
        ends = [*starts[1:], len(counter.ops)]
        counts = [collections.Counter(counter.ops[a:b]) for a, b in zip(starts, ends, strict=True)]
        return counts, len(list(model.parameters()))
    finally:
        dist.destroy_process_group()


# The ops the host dispatches per micro-batch (forward, loss, backward and FSDP's hooks; 2 blocks): a change that
# adds or removes host work moves these. When one does so on purpose, print ``[sum(c.values()) for c in counts]``
# for both modes, say why the numbers moved in the commit message, and set them here; a torch upgrade moves them too.
OPS_PER_MICRO_BATCH = {"sharded": [652, 672, 672], "unsharded": [609, 569, 614]}


@pytest.mark.parametrize("accumulate", ["sharded", "unsharded"])
def test_the_ops_dispatched_per_micro_batch(accumulate, tmp_path):
    counts, params = ops_per_micro_batch(accumulate, tmp_path)
    assert [sum(c.values()) for c in counts] == OPS_PER_MICRO_BATCH[accumulate]
    # FSDP's reduction copies each group's gradients in (chunk_cat: 2 blocks and the root); its gather of one rank
    # is a cast and a copy of every parameter
    reductions = [c["fsdp.chunk_cat.default"] for c in counts]
    casts = [c["aten._to_copy.default"] for c in counts]
    if accumulate == "unsharded":  # gathered by the first micro-batch, reduced by the last: nothing in between
        assert reductions == [0, 0, 3] and casts[0] - casts[1] == 2 * params
    else:
        assert reductions == [3, 3, 3] and casts[0] == casts[1]
    # one replica: no all-reduce over a group of one (FSDP's HSDP path on the 2-D mesh did one per group)
    assert not any(op.startswith("c10d.allreduce") for c in counts for op in c)


def device_types(tree) -> set[str]:
    return {t.device.type for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}


class HostWaits(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op that makes the host wait for ``device`` or moves data between them: a value read on the host
    (``_local_scalar_dense``: item(), bool(), int()), an op whose output shape depends on the data (nonzero,
    masked_select, ...: the host waits to learn it), a copy from the device to the host; and, apart, the copies from
    the host to the device."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type, self.waits, self.to_device = device_type, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default or {
            torch.Tag.dynamic_output_shape,
            torch.Tag.data_dependent_output,
        } & set(func.tags):
            self.waits.append(str(func))  # recorded first: these fail on fake and meta tensors
        out = func(*args, **(kwargs or {}))
        inputs, outputs = device_types((args, kwargs)), device_types(out)
        if self.device_type in inputs and "cpu" in outputs:
            self.waits.append(f"{func} (device to host)")
        elif self.device_type in outputs and "cpu" in inputs:
            self.to_device.append(str(func))
        return out


def host_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch as the loader gives it: host tensors."""
    return torch.zeros(MICRO, SEQ, dtype=torch.long), torch.zeros(MICRO, SEQ, dtype=torch.long)


@pytest.mark.parametrize("residual", ["standard", "ladder"])
def test_the_micro_batch_loop_never_waits_for_the_device(residual):
    # the meta device stands in for the GPU: on a CPU-only build fake cuda tensors (test_inference_gpu_step.py) take
    # no autograd graph and no .to("cuda") (both ask for the CUDA device guard), so the whole loop, backward
    # included, runs on meta tensors: shapes, no data, and an op that needs a value fails
    model = build_on_meta(model_args(tiny_run_config("unused", 256, SEQ, residual=residual).model))
    batch = host_batch()
    record = HostWaits("meta")
    with record:
        loss_sum, _ = accumulate_gradients(model, lambda: batch, ACCUMULATION, 96.0, torch.device("meta"))
    assert loss_sum.device.type == "meta" and all(p.grad is not None for p in model.parameters())
    assert record.waits == []
    # the only host traffic: inputs and labels to the device, once per micro-batch
    assert record.to_device == ["aten._to_copy.default"] * 2 * ACCUMULATION


def test_the_record_sees_waits_and_copies():
    record = HostWaits("meta")
    x = torch.zeros(3, device="meta")
    with record:
        with pytest.raises(RuntimeError, match="item"):  # a meta tensor has no value to give
            x.sum().item()
        with pytest.raises(NotImplementedError, match="nonzero"):
            x.nonzero()
        torch.ones(2).to("meta")
        x.add_(1)  # on the device: not recorded
    assert record.waits == ["aten._local_scalar_dense.default", "aten.nonzero.default"]
    assert record.to_device == ["aten._to_copy.default"]
