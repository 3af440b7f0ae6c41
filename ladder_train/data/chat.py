"""A model's chat template: read from its folder's ``tokenizer_config.json`` and rendered as transformers renders
it (Jinja2), in Jinja's immutable sandbox: the template is data from the model's authors, so rendering it can
read the messages and nothing else.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it may refer to."""

    source: str  # where it came from, for error messages
    template: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text; ``add_generation_prompt`` appends the opening of an assistant turn."""
        from jinja2.exceptions import TemplateError

        try:
            return _compiled(self.template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as err:
            raise InputError(f"{self.source}: chat template failed: {err}") from None


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled once (SFT renders every conversation several times: compiling costs ~1 ms a call)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def _token_text(token) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""


def load_chat_template(folder: str | Path) -> ChatTemplate:
    """The chat template of a Hugging Face model folder (``chat_template`` of its tokenizer_config.json).
    Raises InputError, one line, when the folder has none."""
    path = Path(folder) / TOKENIZER_CONFIG
    if not path.is_file():
        raise InputError(f"{path}: not found; the chat template is read from a model folder's {TOKENIZER_CONFIG}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err})") from None
    template = config.get("chat_template")
    if isinstance(template, list):  # the named-templates form: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str) or not template:
        raise InputError(f"{path}: no 'chat_template' (the model has no chat format)")
    return ChatTemplate(str(path), template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))


def run_tokenizer_config_folder(data_cfg) -> Path | None:
    """The folder a training run took its tokenizer_config.json from (chat template, eos token): data.chat_template,
    else the folder of a local data.tokenizer file (a model adapted with checkpoint.init_from); None if neither."""
    folders = [Path(data_cfg.chat_template)] if data_cfg.chat_template else []
    folders.append(Path(data_cfg.tokenizer).parent)
    return next((folder for folder in folders if (folder / TOKENIZER_CONFIG).is_file()), None)


def tokenizer_config_folder(model: str | Path) -> Path:
    """Where a saved model's tokenizer_config.json is: in its folder, or for a training checkpoint
    (RUN_DIR/checkpoints/step-N) where its run took it from. The model's own folder when there is none."""
    from ..loading import folder_kind, run_config_path

    model = Path(model)
    run_config = run_config_path(model)
    checkpoint = folder_kind(model) in ("checkpoint", "incomplete checkpoint")
    if not (model / TOKENIZER_CONFIG).is_file() and checkpoint and run_config.is_file():
        from ..config import load_config

        return run_tokenizer_config_folder(load_config(run_config).data) or model
    return model
