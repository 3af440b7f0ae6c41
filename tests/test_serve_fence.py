"""The fence of the ladder's held all-reduce under inductor, in plain torch (no model, no vLLM): a two-layer ladder
of RMSNorm + matmul modules whose functional all-reduces are issued as each partial exists and waited a module
later, compiled with inductor at TP 2 over gloo. Unfenced, torch 2.13's inductor gives a different sum from the eager
run (a fused kernel reads the all-reduce's buffer before its wait); fenced with ``ladder_train::fence`` (the op
``TPCommunicator.fence`` issues, which the served ladder of ladder_train/serve uses too), the eager sum. A torch
release that fixes the first, or breaks the second, fails this test."""

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks

import ladder_train.inference  # noqa: F401  (registers the ladder_train::fence op)

DIM, ROWS, LAYERS = 64, 3, 3


def _norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight


def held_ladder(r, weights, group: str, fence: bool):
    """The ladder's stream over ``weights`` (per layer: norm, attention-like matmul, norm, two MLP matmuls), each
    module's all-reduce held until the stream takes it one module later; ``fence`` as TPCommunicator.fence does."""
    all_reduce, wait = torch.ops._c10d_functional.all_reduce, torch.ops._c10d_functional.wait_tensor
    pending_a = pending_m = None
    for n1, wa, n2, w1, w2 in weights:
        if pending_a is not None:
            r = r + wait(pending_a)
        a = _norm(r, n1) @ wa
        if fence:
            r, a = torch.ops.ladder_train.fence([r, a])
        pending_a = all_reduce(a, "sum", group)
        if pending_m is not None:
            r = r + wait(pending_m)
        m = torch.nn.functional.silu(_norm(r, n2) @ w1) @ w2
        if fence:
            r, m = torch.ops.ladder_train.fence([r, m])
        pending_m = all_reduce(m, "sum", group)
    return _norm(r + wait(pending_a) + wait(pending_m), weights[0][0])


def _worker():
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(dist.get_rank())  # each rank its own shard of the weights; one stream for all
        shapes = ((DIM,), (DIM, DIM), (DIM,), (DIM, 2 * DIM), (2 * DIM, DIM))
        weights = [tuple(torch.randn(*s) * 0.2 for s in shapes) for _ in range(LAYERS)]
        r = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(9))
        group = dist.group.WORLD.group_name
        eager = held_ladder(r, weights, group, fence=False)
        out = {}
        for fence in (False, True):
            torch._dynamo.reset()
            compiled = torch.compile(held_ladder, backend="inductor", fullgraph=True)
            out[fence] = (compiled(r, weights, group, fence) - eager).abs().max().item()
        return out
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_inductor_needs_the_fence_to_sum_a_held_all_reduce_right():
    for rank in run_ranks(_worker, 2):
        assert rank[True] < 1e-5, rank  # fenced: the eager sum
        assert rank[False] > 1e-2, rank  # unfenced: inductor's schedule reads the buffer early
