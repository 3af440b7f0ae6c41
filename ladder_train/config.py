"""Typed run configuration: dataclasses checked by OmegaConf.

A recipe is a YAML file (``recipes/*.yaml``) whose sections mirror :class:`Config`. A recipe may start
from others with ``defaults: [base.yaml, ...]`` (paths relative to the recipe; later ones win, the
recipe itself wins over all). Command-line overrides are OmegaConf dotlist items, ``model.n_layers=4``.

``model.preset`` names a shape from ``ladder_train/model/presets.py``; fields the recipe or the command
line set explicitly win over the preset's.

Everything is validated before any work starts: an unknown key, a wrong type or an impossible value
raises :class:`ConfigError` with a one-line message naming the key (and the valid keys or values).
A field's docstring-comment is its documentation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .config_checks import (
    bounded,
    check_layer,
    check_override_text,
    check_recipe_text,
    check_values,
    choice,
    convert_error,
    quote,
)
from .errors import ConfigError
from .folders import write_text
from .model import PRESETS, ModelArgs
from .paper import PAPER_TASKS

# the longest wait in seconds a setting may ask: a loader worker's queue is polled (select.poll) in milliseconds held
# in a C int, 2**31 - 1 ms; the process group's timeout keeps to it too (c10d's store overflows near 2**63 ns)
MAX_WAIT_S = (2**31 - 1) // 1000


@dataclass
class RunConfig:
    name: str = "run"  # run name: the default run directory and wandb run name
    dir: str = "runs/${run.name}"  # everything the run writes goes here (config, metrics, checkpoints)
    seed: int = bounded(0, lambda v: v >= 0, ">= 0 (numpy's generators take no negative seed)")  # init, sampling


@dataclass
class ModelConfig(ModelArgs):
    """``model.*``: the model's own fields (``ModelArgs`` in model/transformer.py documents each one) plus the
    preset they start from."""

    preset: str | None = None  # a shape from presets.py (1.2B, 3.5B, 1.5B, 4.5B, 3.5B-32h, smollm2-135m, tiny, small)

    def __post_init__(self):
        pass  # the config keeps n_kv_heads=None ("= n_heads") as written; ModelArgs resolves it


@dataclass
class WeightedSource:
    """One entry of ``data.sources``: a token folder (ladder-data prepare) and its weight in the mixture."""

    path: str = ""  # a token folder
    weight: float = 1.0  # its share of every global batch is weight / the sum of the weights


@dataclass
class DataConfig:
    # a hub dataset name, a local parquet/jsonl file or folder (train-*/validation-* names pick the split),
    # python-stdlib (the running Python's .py files: offline smoke runs), or a token folder (ladder-data prepare:
    # read with pread in a global order independent of the world size); null when data.sources is set
    source: str | None = "HuggingFaceFW/fineweb-edu"
    # a mixture of token folders instead of data.source: [{path: DIR, weight: 0.7}, ...], sampled to those shares
    # in every global batch (data/mixture.py); data.source is then unset (null)
    sources: list[WeightedSource] = field(default_factory=list)
    hub_config: str | None = "sample-10BT"  # the hub dataset's config name (ignored for local files)
    split: str = "train"
    text_column: str = "text"  # the documents' column; input_ids for shards pre-tokenized by data/prepare.py
    tokenizer: str = "bigcode/starcoder"  # a hub tokenizer name, a local tokenizer.json path, or byte (257 tokens)
    # tokens per training sequence; windows of seq_len + 1 are cut from the stream
    seq_len: int = bounded(2048, lambda v: v >= 1, "at least 1")
    # data loader worker processes per rank (tokenization runs there); 0 = in the trainer
    num_workers: int = bounded(2, lambda v: v >= 0, ">= 0 (0 = tokenize in the trainer)")
    # seconds the trainer waits for a worker's next batch before stopping with an error: a stuck worker (one
    # waiting on a hung file system, say) then ends the run for a restart instead of idling it; 0 = wait forever
    worker_timeout_s: int = bounded(600, lambda v: 0 <= v <= MAX_WAIT_S, f"in [0, {MAX_WAIT_S}] (0 = wait forever)")
    # documents are shuffled in consecutive blocks of this many (per loader worker, seeded by run.seed and the
    # epoch; resumes exactly); 0 = file order
    shuffle_buffer: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = no shuffling)")
    # held-out documents for eval.val_every (its validation split); None = data.source's
    validation_source: str | None = None
    # text: documents, every token scored (pretraining) | chat: conversations (a 'messages' column of
    # {role, content} lists) rendered with data.chat_template, the loss on assistant tokens only (SFT)
    format: str = choice("text", ("text", "chat"))
    # chat: a model folder whose tokenizer_config.json holds the chat template (e.g. ${checkpoint.init_from})
    chat_template: str | None = None


@dataclass
class OptimizerConfig:
    # peak learning rate
    lr: float = bounded(3e-4, lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 trains nothing)")
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = bounded(1e-10, lambda v: v > 0, "positive")
    # not applied to norm weights or biases; embeddings are decayed
    weight_decay: float = bounded(0.1, lambda v: v >= 0, ">= 0")
    # max global gradient norm; 0 disables clipping
    grad_clip: float = bounded(1.0, lambda v: v >= 0, ">= 0 (0 = no clipping)")


@dataclass
class ScheduleConfig:
    # cosine: linear warmup, then cosine decay to min_lr_ratio x peak at total_steps |
    # wsd (warmup-stable-decay): linear warmup, the peak held, then a decay of decay_shape over the last steps
    kind: str = choice("cosine", ("cosine", "wsd"))
    warmup_steps: int = bounded(2000, lambda v: v >= 0, ">= 0")  # linear warmup from 0 to the peak lr
    total_steps: int = bounded(25000, lambda v: v >= 1, "at least 1")  # the decay ends here, at min_lr_ratio x peak
    min_lr_ratio: float = 0.1
    # if set (e.g. 8e9), overrides warmup_steps (tokens / global batch tokens)
    warmup_tokens: float | None = bounded(None, lambda v: v is None or v >= 0, ">= 0, or null")
    # if set (e.g. 100e9), overrides total_steps
    total_tokens: float | None = bounded(None, lambda v: v is None or v > 0, "positive, or null")
    # wsd: the decay's shape from peak to min_lr_ratio x peak over progress p in [0, 1]: linear (1 - p) |
    # cosine | sqrt (1 - sqrt(p): held near the peak longer, then steeper; Hagele et al. 2024 found it beats linear)
    decay_shape: str = choice("sqrt", ("linear", "cosine", "sqrt"))
    # wsd: the decay's length as a fraction of total_steps (rounded to steps)
    decay_fraction: float = bounded(0.2, lambda v: 0 < v <= 1, "in (0, 1]")
    # wsd: the decay's length in steps; overrides decay_fraction when set
    decay_steps: int | None = bounded(None, lambda v: v is None or v >= 1, "at least 1, or null for decay_fraction")


@dataclass
class SpikeConfig:
    """``train.spike.*``: loss-spike detection. A step is a spike when a watched value (the all-reduced loss or
    the gradient norm, the same on every rank) lies more than ``threshold`` standard deviations above the mean
    of the previous ``window`` steps' finite values (train/step.py)."""

    enabled: bool = False
    # steps in the rolling mean and standard deviation; nothing fires before it is full
    window: int = bounded(100, lambda v: v >= 2, "at least 2 (a standard deviation needs two values)")
    # the z-score above which a step is a spike (one-sided: only rises count)
    threshold: float = bounded(6.0, lambda v: math.isfinite(v) and v > 0, "a finite number > 0 (standard deviations)")
    watch: list[str] = field(default_factory=lambda: ["loss", "grad_norm"])  # the values tested: loss, grad_norm
    # log: report it and train on | skip: report it, no update (the batch counts as consumed) | stop: report it,
    # record the batch in RUN_DIR/skip_batches.json and stop (exit 1); a rerun resumes and skips that batch
    action: str = choice("log", ("log", "skip", "stop"))


@dataclass
class TrainConfig:
    global_batch_size: int = 2048  # sequences per optimizer step, over all data-parallel ranks
    micro_batch_size: int = 4  # sequences per forward/backward on one rank; accumulation makes up the rest
    # stop early (smoke runs); None = schedule.total_steps
    max_steps: int | None = bounded(
        None, lambda v: v is None or v >= 1, "at least 1, or null for the schedule's total_steps"
    )
    log_every: int = 10  # steps between metric lines
    # compute dtype: auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    dtype: str = choice("auto", ("auto", "bf16", "fp32"))
    # NaN/inf loss or grad norm: skip the step up to this many times, then stop
    max_nonfinite_skips: int = bounded(0, lambda v: v >= 0, ">= 0")
    # keep the first K transformer blocks fixed (adapting a pretrained model: only the upper layers learn);
    # embeddings, the output head and the final norm still train
    freeze_layers: int = 0
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)


@dataclass
class ParallelConfig:
    dp_replicate: int = bounded(-1, lambda v: v == -1 or v >= 1, "-1 or at least 1")  # replicas (HSDP); -1 = nodes
    dp_shard: int = bounded(-1, lambda v: v == -1 or v >= 1, "-1 or at least 1")  # shards per replica; -1 = per node
    # none | full (recompute every block) | every_n (every ac_every-th block) | selective (every block keeps its
    # matmul and attention outputs and recomputes the rest: norms, rope, activations, adds)
    activation_checkpoint: str = choice("none", ("none", "full", "every_n", "selective"))
    ac_every: int = bounded(2, lambda v: v >= 1, "at least 1")
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
    val_batches: int = bounded(20, lambda v: v >= 1, "at least 1")


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


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    """Read a recipe and the recipes it names in ``defaults``, merged base-first (untyped)."""
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'defaults' cycle through {' -> '.join(str(p) for p in seen)}")
    check_recipe_text(path, path.read_text(errors="replace"))
    try:
        raw = OmegaConf.load(path)
    except Exception as err:  # a YAML syntax error: show the file and the first line of the reason
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(raw).__name__}")
    bases = raw.pop("defaults", [])
    if isinstance(bases, str):
        bases = [bases]
    merged = OmegaConf.create({})
    for base in bases:
        merged = OmegaConf.merge(merged, _read_yaml(path.parent / str(base), seen + (path.resolve(),)))
    return OmegaConf.merge(merged, raw)


def _merge_typed(schema: DictConfig, layer: DictConfig, origin: str) -> DictConfig:
    try:
        return OmegaConf.merge(schema, layer)
    except OmegaConfBaseException as err:
        raise convert_error(err, origin, Config) from None
    except TypeError as err:  # a container of another kind that check_layer did not see (a preset's)
        raise ConfigError(f"{origin}: {err}") from None


def _merge_layers(schema: DictConfig, layers: list[tuple[str, DictConfig]]) -> DictConfig:
    """``schema`` with ``layers`` merged over it in order, in one merge (each merge deep-copies what it merges
    into: one per layer was half of load_config's time); layer by layer only to name the one that fails."""
    try:
        return OmegaConf.merge(schema, *(layer for _, layer in layers))
    except (OmegaConfBaseException, TypeError):
        pass
    merged = schema
    for origin, layer in layers:
        merged = _merge_typed(merged, layer, origin)
    return merged


@functools.cache
def _schema() -> DictConfig:
    """The typed defaults, built once per process: building them costs more than a merge, which copies them."""
    return OmegaConf.structured(Config)


def load_config(recipe: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build the run's config: schema defaults, then the preset named by ``model.preset``, then the
    recipe (with its ``defaults``), then the command-line ``overrides``. Raises ConfigError."""
    layers: list[tuple[str, DictConfig]] = []
    if recipe is not None:
        layers.append((str(recipe), _read_yaml(Path(recipe))))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {quote(item)} is not of the form key=value (e.g. model.n_layers=4)")
        check_override_text(item)
        try:
            layers.append((f"override {quote(item)}", OmegaConf.from_dotlist([item])))
        except Exception as err:  # OmegaConf's or YAML's: the first line of the reason
            raise ConfigError(f"override {quote(item)}: {str(err).splitlines()[0]}") from None
    for origin, layer in layers:
        check_layer(OmegaConf.to_container(layer, resolve=False), Config, origin)

    # the preset goes under every layer: the last layer that names one decides (check_layer held its type)
    preset = None
    for _, layer in layers:
        if isinstance(layer.get("model"), DictConfig) and "preset" in layer.model:
            preset = layer.model.preset
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"key 'model.preset' is {preset!r}; available: {', '.join(PRESETS)}")
        layers.insert(0, (f"preset {preset}", OmegaConf.create({"model": PRESETS[preset]})))
    merged = _merge_layers(_schema(), layers)
    if merged.data.sources and not any("source" in layer.get("data", {}) for _, layer in layers):
        merged.data.source = None  # a mixture replaces the default data.source; one set explicitly is refused
    try:
        OmegaConf.resolve(merged)
        cfg: Config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise convert_error(err, str(recipe) if recipe else "config", Config) from None
    check_values(cfg)
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML: printed at start and saved as RUN_DIR/config.yaml."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Config, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, to_yaml(cfg))  # never through a link planted in the run folder


def to_dict(cfg: Config) -> dict[str, Any]:
    """A plain nested dict (for wandb and JSON)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def model_args(model: ModelConfig) -> ModelArgs:
    """The ModelArgs the Transformer is built from: every field of ``model`` but the preset."""
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(ModelArgs)}
    # lists and mappings (desync_pattern, rope_scaling) as plain Python values: they go into JSON and checkpoints
    return ModelArgs(**{k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in fields.items()})


__all__ = [
    "Config",
    "ConfigError",
    "load_config",
    "model_args",
    "save_config",
    "to_dict",
    "to_yaml",
]
