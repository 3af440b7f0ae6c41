"""The optimizer step's collectives and kernels. Gradient accumulation under FSDP2 (``parallel.accumulate``):
kept unsharded, a step makes as many all-gathers and reduce-scatters with 4 micro-batches as with 1; FSDP's
per-micro-batch cycle makes more; both give the same numbers (counted on FSDP's own collectives over gloo,
2 ranks). AdamW is the fused kernel on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from test_train import assert_same, global_batches, tiny_config


def counted_trainings(runs: list[tuple[int, str, dict]], tmp: str) -> list[tuple]:
    """Per run (micro-batch, accumulation, overrides), one after another in one process group: (FSDP collectives per
    optimizer step, losses and gradient norms, the mode the trainer chose)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    counts = {"all_gather": 0, "reduce_scatter": 0}

    def counting(kind, call):
        def wrapper(*args, **kwargs):
            counts[kind] += 1
            return call(*args, **kwargs)

        return wrapper

    collectives.DefaultAllGather.__call__ = counting("all_gather", collectives.DefaultAllGather.__call__)
    collectives.DefaultReduceScatter.__call__ = counting("reduce_scatter", collectives.DefaultReduceScatter.__call__)
    env = init_distributed()
    results = []
    try:
        for n, (micro, accumulate, extra) in enumerate(runs):
            overrides = {"train.max_steps": 3, "parallel.accumulate": accumulate, **extra}
            cfg = tiny_config("ladder", micro, f"{tmp}/{n}", **overrides)
            trainer = Trainer(cfg, env, batches=global_batches(env.rank, env.world_size, micro))
            per_step, step = [], trainer.train_step

            def counted_step(step=step, per_step=per_step):
                before = dict(counts)
                outcome = step()
                per_step.append({kind: counts[kind] - before[kind] for kind in counts})
                return outcome

            trainer.train_step = counted_step
            losses = [(r["loss"], r["grad_norm"]) for r in trainer.train()]
            results.append((per_step, losses, trainer.micro_batch_plan.accumulate))
        return results
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_kept_unsharded_a_step_gathers_and_reduces_once_however_many_micro_batches(tmp_path):
    # 8 sequences per step on 2 ranks: 4 per rank, in 1 micro-batch of 4 or 4 micro-batches of 1
    runs = [(4, "unsharded", {}), (1, "unsharded", {}), (1, "sharded", {})]
    results = run_ranks(counted_trainings, 2, runs, str(tmp_path))[0]
    (one_micro, _, mode_one), (four_micro, unsharded_losses, mode), (cycled, sharded_losses, mode_sharded) = results
    assert (mode_one, mode, mode_sharded) == ("unsharded", "unsharded", "sharded")
    assert four_micro == one_micro
    assert one_micro[1]["all_gather"] > 0 and one_micro[1]["reduce_scatter"] > 0
    # FSDP's cycle on every micro-batch: 4x the reduce-scatters, and a gather per micro-batch
    assert cycled[1]["reduce_scatter"] == 4 * one_micro[1]["reduce_scatter"]
    assert cycled[1]["all_gather"] > 3 * one_micro[1]["all_gather"]
    assert_same(unsharded_losses, sharded_losses, 1e-5)


@pytest.mark.slow
def test_blocks_in_units_of_two_gather_and_reduce_once_per_unit_with_the_same_numbers(tmp_path):
    """4 ladder layers on 2 ranks, 2 micro-batches a step, in FSDP units of 1 block (4 units) or 2 (2 units); the root's
    collectives are the same. Kept unsharded, a step gathers and reduces each unit once: 2 fewer of each. Sharded,
    each micro-batch gathers every unit in forward and all but the last again in backward, and reduces every unit:
    2 x (4 + 3 - 2 - 1) = 8 fewer gathers and 2 x 2 = 4 fewer reductions. The same losses and gradient norms."""
    fewer = {"unsharded": {"all_gather": 2, "reduce_scatter": 2}, "sharded": {"all_gather": 8, "reduce_scatter": 4}}
    single, paired = {"model.n_layers": 4}, {"model.n_layers": 4, "parallel.blocks_per_fsdp_unit": 2}
    runs = [(2, accumulate, units) for accumulate in fewer for units in (single, paired)]
    results = run_ranks(counted_trainings, 2, runs, str(tmp_path))[0]
    for n, accumulate in enumerate(fewer):
        (single_steps, single_losses, mode), (paired_steps, paired_losses, _) = results[2 * n : 2 * n + 2]
        assert mode == accumulate
        for step_single, step_paired in zip(single_steps, paired_steps, strict=True):
            assert {kind: step_single[kind] - k for kind, k in step_paired.items()} == fewer[accumulate]
        assert_same(single_losses, paired_losses, 1e-6)


def test_adamw_is_fused_on_cuda_and_foreach_on_the_cpu():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ladder_train.config import load_config
    from ladder_train.train.optim import build_optimizer

    settings = load_config(None, []).train.optimizer

    def model_on(device: str) -> torch.nn.Module:
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(torch.empty(4, 4, device=device))  # decayed group
        model.norm = torch.nn.Parameter(torch.empty(4, device=device))  # no-decay group
        return model

    with FakeTensorMode():  # cuda tensors without a GPU
        assert build_optimizer(model_on("cuda"), settings).defaults["fused"] is True
    assert build_optimizer(model_on("cpu"), settings).defaults["fused"] is None  # torch's default: foreach


def test_the_dry_run_names_the_largest_micro_batch_that_fits_the_gpu():
    from pathlib import Path

    from ladder_train.config import load_config, model_args
    from ladder_train.train.memory_plan import GIB, dry_run, memory_plan

    cfg = load_config(Path(__file__).resolve().parents[1] / "recipes" / "ladder_3b.yaml")
    lines = dry_run(cfg, "16x8", 80 * GIB).splitlines()
    assert lines[-2] == "on a 80 GiB GPU, unsharded: the largest micro-batch that fits 90 % of it is 4 (plan 53.58 GiB)"
    assert lines[-1] == "on a 80 GiB GPU, sharded: the largest micro-batch that fits 90 % of it is 8 (plan 65.19 GiB)"
    # of the 16 sequences per rank, 8 (2 micro-batches per step) fits sharded only, 16 neither way
    local = int(
        next(x for x in lines if " per GPU" in x and "parameters" in x).split(", ")[-1].split()[0].replace(",", "")
    )
    eight = memory_plan(cfg, model_args(cfg.model), local, 8, torch.device("cuda"), accumulation=2)
    assert eight.unsharded > 0.9 * 80 * GIB > eight.sharded
    sixteen = memory_plan(cfg, model_args(cfg.model), local, 16, torch.device("cuda"), accumulation=1)
    assert sixteen.unsharded > 0.9 * 80 * GIB and sixteen.sharded > 0.9 * 80 * GIB
    assert dry_run(cfg, "16x8", 30 * GIB).splitlines()[-2].endswith("unsharded: no micro-batch fits 90 % of it")
