"""What ``ladder-eval`` evaluates: a saved model (a Hugging Face Llama folder or a training checkpoint) and its
tokenizer, checked against each other before any weight is loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint.files import verify_checkpoint
from ..data.tokenizer import eos_id, model_tokenizer
from ..folders import folder_kind, run_config_path
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


def check_tokenizer(config: dict, tokenizer, config_path: Path, tokenizer_name: str) -> None:
    """The model must have been trained with this tokenizer: same vocabulary size, same end-of-text id."""
    vocab = tokenizer.get_vocab_size()
    if config.get("vocab_size") != vocab:
        raise EvalError(
            f"tokenizer mismatch: {config_path} has vocab_size {config.get('vocab_size')} but tokenizer {tokenizer_name} has {vocab}"
        )
    eot_id = eos_id(tokenizer, where=tokenizer_name)
    # ladder-train's own exports separate documents with <|endoftext|>; a pretrained model's eos may differ
    # (SmolLM2-Instruct's is <|im_end|>), and scoring only needs <|endoftext|> to exist
    if "residual" in config and config.get("eos_token_id") is not None and config["eos_token_id"] != eot_id:
        raise EvalError(
            f"tokenizer mismatch: {config_path} has eos_token_id {config['eos_token_id']} but the document separator is {eot_id} in tokenizer {tokenizer_name}"
        )


def open_saved_model(model_dir: str | Path, tokenizer: str | None = None) -> SavedModel:
    """The folder's kind, config and tokenizer (``tokenizer`` overrides the folder's own, see
    ``data.tokenizer.model_tokenizer``), checked against each other; no weights are read."""
    model_dir = Path(model_dir)
    kind, config = _read_config(model_dir)
    loaded, name = model_tokenizer(model_dir, tokenizer)
    config_path = model_dir / "config.json" if kind == "export" else model_dir
    check_tokenizer(config, loaded, config_path, name)
    return SavedModel(model_dir, kind, config, loaded, name)
