"""A model's chat template: read from its folder's ``tokenizer_config.json`` and rendered as transformers renders
it (Jinja2), in Jinja's immutable sandbox: the template is data from the model's authors, so rendering it can
read the messages and nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..files import is_plain_file
from ..folders import TOKENIZER_CONFIG
from .model_files import token_text


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special tokens it may refer to."""

    source: str  # where it came from, for error messages
    template: str
    bos_token: str = ""
    eos_token: str = ""

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The conversation as text; ``add_generation_prompt`` appends the opening of an assistant turn. A render
        that runs longer than MAX_RENDER_SECONDS or writes more than MAX_RENDER_CHARS is refused."""
        from jinja2.exceptions import TemplateError

        pieces, written = [], 0
        try:
            with _time_limit(MAX_RENDER_SECONDS):
                stream = _compiled(self.template).generate(
                    messages=messages,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=self.bos_token,
                    eos_token=self.eos_token,
                )
                for piece in stream:
                    written += len(piece)
                    if written > MAX_RENDER_CHARS:
                        raise _RenderLimit(f"rendered more than {MAX_RENDER_CHARS:,} characters for one conversation")
                    pieces.append(piece)
        except _RenderLimit as err:
            raise InputError(f"{self.source}: chat template refused: it {err}") from None
        except (TemplateError, TypeError, ValueError, LookupError, AttributeError) as err:
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise InputError(f"{self.source}: chat template failed: {reason}") from None
        return "".join(pieces)


# a chat template is data from a model's authors: rendering one conversation may take this long and write this much
MAX_RENDER_SECONDS = 10.0
MAX_RENDER_CHARS = 1_000_000


class _RenderLimit(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float):
    """SIGALRM after ``seconds`` interrupts the render (main thread only, and only when no other alarm is armed:
    the loader workers' grace period after a preemption signal uses one)."""
    armable = threading.current_thread() is threading.main_thread() and signal.getitimer(signal.ITIMER_REAL)[0] == 0

    def expire(signum, frame):
        raise _RenderLimit(f"ran longer than {seconds:g} s for one conversation")

    previous = signal.signal(signal.SIGALRM, expire) if armable else None
    if armable:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if armable:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template compiled once (SFT renders every conversation several times: compiling costs ~1 ms a call)."""
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        """Jinja's immutable sandbox, and no string or list repeated (or number raised) past the output limit in
        one expression, before any of it is written."""

        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context, operator, left, right):
            sized = [x for x in (left, right) if isinstance(x, (str, list, tuple))]
            counts = [x for x in (left, right) if isinstance(x, int) and not isinstance(x, bool)]
            if operator == "*" and sized and counts and len(sized[0]) * counts[0] > MAX_RENDER_CHARS:
                raise SecurityError(f"a repetition of {len(sized[0]) * counts[0]:,} items")
            if operator == "**" and isinstance(right, int) and abs(right) > 1000:
                raise SecurityError(f"an exponent of {right}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise TemplateError(message)

    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def load_chat_template(folder: str | Path) -> ChatTemplate:
    """The chat template of a Hugging Face model folder (``chat_template`` of its tokenizer_config.json).
    Raises InputError, one line, when the folder has none."""
    path = Path(folder) / TOKENIZER_CONFIG
    if not is_plain_file(path):
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
    return ChatTemplate(str(path), template, token_text(config.get("bos_token")), token_text(config.get("eos_token")))
