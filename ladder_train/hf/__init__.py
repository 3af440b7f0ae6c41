"""ladder-train's models in transformers: ``LadderLlamaConfig`` / ``LadderLlamaForCausalLM`` (model_type
``ladder_llama``) for the parallel and ladder layouts and hybrids; a standard model exports as a plain Llama.

The two ``*_ladder_llama.py`` files import only torch and transformers: every parallel or ladder export carries
copies of them, named by ``auto_map`` in its config.json, so it loads with ``trust_remote_code=True`` anywhere.
Importing ``ladder_train`` registers the classes with ``AutoConfig`` and ``AutoModelForCausalLM`` (once transformers
is imported, so a command that never uses transformers does not pay for importing it).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
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


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``transformers`` is first imported it lets the other finders locate it and
    registers the classes right after the module has run (a post-import hook)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformers":
            return None
        sys.meta_path.remove(self)  # once only; find_spec below must not come back here
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_register(module):
            run_module(module)
            _register_or_warn()

        spec.loader.exec_module = run_then_register
        return spec


def _register_or_warn() -> None:
    try:
        register()
    except Exception as err:  # an incompatible transformers must not break importing it
        warnings.warn(f"ladder_train: ladder_llama not registered with transformers ({err})", stacklevel=2)


def register_when_transformers_is_imported() -> None:
    if "transformers" in sys.modules:
        _register_or_warn()
    elif not any(isinstance(finder, _RegisterAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
