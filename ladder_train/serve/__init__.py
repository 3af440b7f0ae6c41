"""Serving ladder-train's exports with vLLM: ``LadderLlamaForCausalLM`` (``model.py``) on vLLM's layers for every
residual layout, the ladder's all-reduce held across the next module (``comm.py``), the layouts read from the
config and the export checked before the engine allocates (``layouts.py``), and the all-reduces in flight counted
(``counting.py``).

vLLM is imported only in this package, and only once vLLM loads the plugin: ``register`` is the
``vllm.general_plugins`` entry point of pyproject.toml, so ``vllm serve EXPORT`` and ``vllm.LLM(EXPORT)`` find the
architecture without ``trust_remote_code`` (the export's own Python files are never run).
"""

from __future__ import annotations

ARCHITECTURE = "LadderLlamaForCausalLM"


def register() -> None:
    """Make vLLM (and transformers' ``AutoConfig``) know ``ladder_llama`` exports; safe to call more than once."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP, VerifyAndUpdateConfig

    from ..hf import register as register_transformers

    register_transformers()
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "ladder_train.serve.model:LadderLlamaForCausalLM")

    class CheckExport(VerifyAndUpdateConfig):
        @staticmethod
        def verify_and_update_config(vllm_config) -> None:
            from .layouts import check_served_export

            model, parallel = vllm_config.model_config, vllm_config.parallel_config
            check_served_export(
                model.model, parallel.tensor_parallel_size, parallel.pipeline_parallel_size, model.hf_config
            )

    MODELS_CONFIG_MAP[ARCHITECTURE] = CheckExport


__all__ = ["ARCHITECTURE", "register"]
