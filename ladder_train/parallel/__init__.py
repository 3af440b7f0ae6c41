"""Device mesh, FSDP2/HSDP sharding, activation checkpointing, compile, and sharded initialisation."""

from .apply import init_sharded_weights, parallelize, resolve_dtype
from .mesh import BatchSplit, RankEnv, build_mesh, free_port, init_distributed, resolve_degrees

__all__ = [
    "BatchSplit",
    "RankEnv",
    "build_mesh",
    "free_port",
    "init_distributed",
    "init_sharded_weights",
    "parallelize",
    "resolve_degrees",
    "resolve_dtype",
]
