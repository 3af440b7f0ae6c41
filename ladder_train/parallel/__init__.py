"""Device mesh, FSDP2/HSDP sharding, activation checkpointing, compile, and sharded initialisation."""

from .apply import parallelize
from .init import init_sharded_weights
from .mesh import Dist, build_mesh, free_port, init_distributed, resolve_degrees

__all__ = [
    "Dist",
    "build_mesh",
    "free_port",
    "init_distributed",
    "init_sharded_weights",
    "parallelize",
    "resolve_degrees",
]
