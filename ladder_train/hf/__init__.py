"""ladder-train's models in transformers: ``LadderLlamaConfig`` / ``LadderLlamaForCausalLM`` (model_type
``ladder_llama``) for the parallel, ladder and desync layouts and hybrids; a standard model exports as a plain Llama.

The two ``*_ladder_llama.py`` files import only torch and transformers: every parallel, ladder or desync export carries
copies of them, named by ``auto_map`` in its config.json, so it loads with ``trust_remote_code=True`` anywhere.
``register()`` makes ``AutoConfig`` and ``AutoModelForCausalLM`` read them without the folder's code; nothing is
registered on import (importing ``ladder_train`` changes no import machinery and does not import transformers).
"""

from __future__ import annotations

from pathlib import Path

MODEL_TYPE = "ladder_llama"
ARCHITECTURE = "LadderLlamaForCausalLM"
# the files an export carries, and how transformers finds the classes in them
MODEL_FILES = ("configuration_ladder_llama.py", "modeling_ladder_llama.py")
AUTO_MAP = {
    "AutoConfig": "configuration_ladder_llama.LadderLlamaConfig",
    "AutoModelForCausalLM": "modeling_ladder_llama.LadderLlamaForCausalLM",
}


def model_file_paths() -> list[Path]:
    return [Path(__file__).with_name(name) for name in MODEL_FILES]


def register() -> None:
    """Make ``AutoConfig`` / ``AutoModelForCausalLM.from_pretrained`` read ``ladder_llama`` folders."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .configuration_ladder_llama import LadderLlamaConfig
    from .modeling_ladder_llama import LadderLlamaForCausalLM

    AutoConfig.register(MODEL_TYPE, LadderLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(LadderLlamaConfig, LadderLlamaForCausalLM, exist_ok=True)
