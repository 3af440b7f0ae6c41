"""What ``ladder-eval`` evaluates: a saved model (a Hugging Face Llama folder or a training checkpoint) and its
tokenizer, checked against each other before any weight is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint.integrity import verify_checkpoint
from ..data.model_files import token_text
from ..data.tokenizer import eos_id, model_tokenizer
from ..folders import TOKENIZER_CONFIG, folder_kind, read_optional_json, run_config_path
from ..loading import load_model, model_from_checkpoint, resolve_source
from ..model import Transformer
from ..model.hf_format import INDEX_FILE, WEIGHTS_FILE, hf_config
from .adapter import EvalError


@dataclass(frozen=True)
class SavedModel:
    """A model folder (``kind``: ``export`` or ``checkpoint``, as ``folders.folder_kind`` says), its
    config.json fields (a checkpoint's are those ladder-export would write) and its tokenizer."""

    path: Path
    kind: str
    config: dict
    tokenizer: object
    tokenizer_name: str

    def load(self, device) -> Transformer:
        """The model, fp32, on ``device``; a checkpoint was verified when it was opened."""
        if self.kind == "checkpoint":
            return model_from_checkpoint(self.path, device, verify=False)
        return load_model(self.path, device=device)

    def default_results_path(self) -> Path:
        """An export's MODEL_DIR/eval/results.json; a checkpoint's results go beside the run's other
        evaluations, RUN_DIR/eval/step-N.json."""
        if self.kind == "checkpoint":
            return run_config_path(self.path).parent / "eval" / f"{self.path.name}.json"
        return self.path / "eval" / "results.json"


def _read_config(model_dir: Path) -> tuple[str, dict]:
    kind = folder_kind(model_dir)
    if kind == "checkpoint":
        verify_checkpoint(model_dir, no_dist=True)  # a damaged checkpoint is named before anything else is read
        return kind, hf_config(resolve_source(model_dir).args)
    if kind == "export":
        resolve_source(model_dir)  # config.json and the weights' headers checked first (one line, exit 2)
        return kind, json.loads((model_dir / "config.json").read_text())
    if not (model_dir / "config.json").is_file():
        raise EvalError(f"{model_dir}: not a model folder (missing config.json) nor a complete training checkpoint")
    raise EvalError(f"{model_dir}: not a model folder (missing {WEIGHTS_FILE} or {INDEX_FILE})")


def check_tokenizer(
    config: dict, tokenizer, config_path: Path, tokenizer_name: str, folder: Path | None = None
) -> None:
    """The tokenizer must be the model's: the same vocabulary size and, for a model folder (``folder``), an eos
    that is an end token at the same id in it.

    What scoring depends on is the tokenizer's ids and its document separator (<|endoftext|>), which LadderLM puts
    before an empty context and each rolling window, as the model saw it between pretraining documents; the model's
    eos (what generation stops at) plays no part in a log-likelihood. A chat model's eos is an end of turn
    (SmolLM2-Instruct: <|im_end|> = 2, <|endoftext|> = 0) and scores the same as one whose eos is the separator, so
    config.json's eos_token_id may be the separator or any special token of the tokenizer (Llama 3.1 lists three).
    A tokenizer of another model betrays itself there: eos ids that are ordinary words in it, or the folder's own
    eos_token (tokenizer_config.json) missing from it or at another id."""
    vocab = tokenizer.get_vocab_size()
    if config.get("vocab_size") != vocab:
        raise EvalError(
            f"tokenizer mismatch: {config_path} has vocab_size {config.get('vocab_size')} but tokenizer {tokenizer_name} has {vocab}"
        )
    eot_id = eos_id(tokenizer, where=tokenizer_name)
    eos = config.get("eos_token_id")
    if folder is None or eos is None:  # a checkpoint's config.json is ladder-export's default, not the model's
        return
    ids = eos if isinstance(eos, list) else [eos]
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    words = [i for i in ids if i != eot_id and i not in special]
    if words:
        word = tokenizer.id_to_token(words[0]) if isinstance(words[0], int) and 0 <= words[0] < vocab else None
        raise EvalError(
            f"tokenizer mismatch: {config_path} has eos_token_id {eos}, but {words[0]} is {word!r} in tokenizer "
            f"{tokenizer_name}, not an end token (its document separator is {eot_id})"
        )
    named = token_text(read_optional_json(folder / TOKENIZER_CONFIG).get("eos_token"))
    named_id = tokenizer.token_to_id(named) if named else None
    if len(ids) == 1 and ids[0] != eot_id and named and named_id != ids[0]:
        where = "not in it" if named_id is None else f"{named_id} in it"
        raise EvalError(
            f"tokenizer mismatch: {config_path} has eos_token_id {eos}, which {folder / TOKENIZER_CONFIG} names "
            f"{named!r}, but that token is {where} (tokenizer {tokenizer_name})"
        )


def open_saved_model(model_dir: str | Path, tokenizer: str | None = None) -> SavedModel:
    """The folder's kind, config and tokenizer (``tokenizer`` overrides the folder's own, see
    ``data.tokenizer.model_tokenizer``), checked against each other; no weights are read."""
    model_dir = Path(model_dir)
    kind, config = _read_config(model_dir)
    loaded, name = model_tokenizer(model_dir, tokenizer)
    config_path = model_dir / "config.json" if kind == "export" else model_dir
    check_tokenizer(config, loaded, config_path, name, model_dir if kind == "export" else None)
    return SavedModel(model_dir, kind, config, loaded, name)
