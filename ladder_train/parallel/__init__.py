"""Device mesh, FSDP2/HSDP sharding, activation checkpointing, compile, the per-micro-batch plan, sharded
initialisation, and the compute dtype."""

from .apply import DTYPES, MicroBatchPlan, init_sharded_weights, parallelize, resolve_dtype
from .mesh import BatchSplit, RankEnv, build_mesh, free_port, init_distributed, resolve_degrees, together

__all__ = [
    "DTYPES",
    "BatchSplit",
    "MicroBatchPlan",
    "RankEnv",
    "build_mesh",
    "free_port",
    "init_distributed",
    "init_sharded_weights",
    "parallelize",
    "resolve_degrees",
    "resolve_dtype",
    "together",
]
