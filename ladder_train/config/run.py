"""The run's other sections: ``run.*`` (name, folder, seed), ``parallel.*`` (the mesh, activation checkpointing,
compile, FSDP's accumulation), ``checkpoint.*``, ``wandb.*``, ``eval.*``, ``profile.*`` and ``tensorboard.*``, with
the rules among their own fields."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..paper import PAPER_TASKS
from .schema import MAX_WAIT_S, bounded, choice


@dataclass
class RunConfig:
    name: str = "run"  # run name: the default run directory and wandb run name
    dir: str = "runs/${run.name}"  # everything the run writes goes here (config, metrics, checkpoints)
    seed: int = bounded(0, lambda v: v >= 0, ">= 0 (numpy's generators take no negative seed)")  # init, sampling


@dataclass
class ParallelConfig:
    dp_replicate: int = bounded(-1, lambda v: v == -1 or v >= 1, "-1 or at least 1")  # replicas (HSDP); -1 = nodes
    dp_shard: int = bounded(-1, lambda v: v == -1 or v >= 1, "-1 or at least 1")  # shards per replica; -1 = per node
    # none | full (recompute every block) | every_n (every ac_every-th block) | selective (every block keeps its
    # matmul and attention outputs and recomputes the rest: norms, rope, activations, adds)
    activation_checkpoint: str = choice("none", ("none", "full", "every_n", "selective"))
    ac_every: int = bounded(2, lambda v: v >= 1, "at least 1")  # every_n: checkpoint every ac_every-th block
    compile: bool = False  # torch.compile each block (a cold compile costs ~30 s; no gain on CPU)
    # gradient accumulation over a step's micro-batches: unsharded = the blocks stay gathered and are reduced once per
    # optimizer step (their compute-dtype parameters and fp32 gradients must fit); sharded = FSDP's gather/reduce
    # cycle on every micro-batch (least memory); auto = unsharded where the memory plan says it fits the device
    accumulate: str = choice("auto", ("auto", "unsharded", "sharded"))
    # consecutive blocks sharded as one FSDP unit: FSDP's hooks run once per unit (sharded: two units gathered)
    blocks_per_fsdp_unit: int = bounded(1, lambda v: v >= 1, "at least 1")
    # init and collective timeout (s): a rank waiting longer fails; rank 0's lm-eval is exempt
    timeout_s: int = bounded(1800, lambda v: 1 <= v <= MAX_WAIT_S, f"in [1, {MAX_WAIT_S}] seconds")


@dataclass
class CheckpointConfig:
    # steps between checkpoints; 0 = only at the end
    every: int = bounded(1000, lambda v: v >= 0, ">= 0 (0 = only at the end)")
    keep: int = 3  # keep the last k complete checkpoints; 0 = keep all (negative values are refused)
    async_save: bool = False  # write checkpoints in the background while training continues
    load: str | None = None  # start from this checkpoint instead of the newest one in run.dir
    load_model_only: bool = False  # take weights only (fine-tuning), not optimizer/data state
    # a fresh run starts from these weights instead of random ones: a Hugging Face Llama folder, an export or a
    # training checkpoint. The model.* shape must match it; model.residual / ladder_layers may differ (the
    # conversion to a (hybrid) ladder). Ignored when run.dir already holds a checkpoint to resume.
    init_from: str | None = None


@dataclass
class WandbConfig:
    # online | offline | disabled (WANDB_MODE overrides)
    mode: str = choice("online", ("online", "offline", "disabled"))
    project: str | None = None  # None = WANDB_PROJECT or "ladder-train"
    entity: str | None = None  # None = WANDB_ENTITY or the account default
    name: str | None = None  # None = run.name


@dataclass
class EvalConfig:
    # lm-eval task names (the paper's six and wikitext by default; *_local tasks read eval.local_data)
    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))
    include_path: str | None = None  # a folder of the user's own lm-eval task YAMLs (offline tasks)
    local_data: str | None = None  # a folder of local eval sets (layout of ../shared/eval) for the *_local tasks
    # sequences per forward pass when scoring eval requests
    batch_size: int = bounded(8, lambda v: v >= 1, "at least 1")
    at_end: bool = True  # evaluate the final checkpoint when training ends
    # also evaluate every N-th checkpoint; 0 = only at the end
    every: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = only at the end)")
    mode: str = choice("inprocess", ("inprocess", "slurm"))  # inprocess | slurm (submit slurm/eval.sh)
    # rows per task (quick checks); None = all
    limit: int | None = bounded(None, lambda v: v is None or v >= 1, "at least 1, or null for every row")
    # steps between validation losses on data.validation_source; 0 = never
    val_every: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = never)")
    val_batches: int = bounded(20, lambda v: v >= 1, "at least 1")  # held-out batches per validation loss


@dataclass
class ProfileConfig:
    """``profile.*``: what each rank records for looking inside a run, into RUN_DIR/profile/
    (``train/observability.py``). The schedule counts optimizer steps from the start of the process."""

    enabled: bool = False  # torch.profiler chrome traces (CPU activity; CUDA kernels too on a GPU), one per rank
    # untraced steps first (the first steps are not typical: allocation, warm caches)
    wait: int = bounded(5, lambda v: v >= 0, ">= 0")
    # then steps traced but discarded (the profiler's own start-up cost)
    warmup: int = bounded(2, lambda v: v >= 0, ">= 0")
    # then steps kept in the trace: rank{r}_steps{a}-{b}.pt.trace.json
    active: int = bounded(3, lambda v: v >= 1, "at least 1")
    # how many wait/warmup/active cycles, each its own trace; 0 = until the run ends
    repeat: int = bounded(1, lambda v: v >= 0, ">= 0 (0 = until the run ends)")
    record_shapes: bool = False  # the input shapes of each op (larger traces)
    profile_memory: bool = False  # the memory each op allocates and frees (the memory view on the CPU too)
    with_stack: bool = False  # the Python stack of each op (much larger traces)
    # CUDA only: record the allocator's history from the start and dump a snapshot (pytorch.org/memory_viz)
    # after this step, and at an OutOfMemoryError; 0 = only at an OutOfMemoryError; None = no recording
    memory_snapshot_step: int | None = bounded(
        None, lambda v: v is None or v >= 0, ">= 0 (0 = only at an OutOfMemoryError), or null for no recording"
    )


@dataclass
class TensorBoardConfig:
    enabled: bool = False  # also write the logged scalars to RUN_DIR/tensorboard/ (rank 0), beside wandb


def check_checkpoint(cfg: CheckpointConfig) -> None:
    """A keep count that is one, and one way to start from saved weights."""
    if cfg.keep < 0:
        raise ConfigError(f"key 'checkpoint.keep' must be >= 0 (0 keeps every checkpoint), got {cfg.keep}")
    if cfg.init_from is not None and cfg.load is not None:
        raise ConfigError(
            "keys 'checkpoint.init_from' and 'checkpoint.load' are both set: init_from starts a new run from weights, "
            "load continues a saved one; set one"
        )
