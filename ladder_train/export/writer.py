"""Hub-ready model folders: a training checkpoint (``export_checkpoint``) or a Hugging Face format folder
(``export_folder``) to ``model.safetensors`` + ``config.json`` (Hugging Face Llama names; see model/hf_format.py),
with the tokenizer, ``generation_config.json`` (the bos/eos generation stops at, as ladder-generate does), for a
parallel, ladder or desync model the transformers classes its ``auto_map`` names, and a model card (``README.md``).
``ladder-export`` (cli/export.py) and the trainer's ``eval.mode=slurm`` call them.

Writing into a folder replaces an earlier export's files there (``EXPORT_FILES``) and leaves everything else;
ladder-export refuses a non-empty folder unless ``--overwrite``. Every file, the weights included, gets the mode
the umask gives (readable by a cluster's other users under the usual umask 022)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from ..checkpoint import read_trainer_state
from ..config import load_config
from ..data import load_tokenizer, run_tokenizer_config_folder, stop_tokens
from ..data.model_files import token_text
from ..errors import DataError, InputError
from ..files import copy_to, is_plain_file, refuse_link, remove_written, write_text
from ..folders import (
    COMPLETE_MARKER,
    CONFIG_JSON,
    GENERATION_CONFIG,
    TOKENIZER_CONFIG,
    TOKENIZER_FILE,
    complete_checkpoints,
    folder_kind,
    read_optional_json,
    run_config_path,
    step_number,
)
from ..hf import MODEL_FILES
from ..loading import load_model, model_from_checkpoint
from ..model.hf_format import DEFAULT_TOKEN_IDS, INDEX_FILE, WEIGHTS_FILE, os_error_of, save_export
from ..parallel import DTYPES
from .model_card import CARD_FILE, DEFAULT_LICENSE, CardFacts, source_license, write_model_card

# every file an export writes: what --overwrite replaces in an existing folder, and nothing else
EXPORT_FILES = (
    WEIGHTS_FILE,
    CONFIG_JSON,
    TOKENIZER_FILE,
    TOKENIZER_CONFIG,
    GENERATION_CONFIG,
    CARD_FILE,
    *MODEL_FILES,
)


def export_checkpoint(
    checkpoint: Path, out_dir: Path, dtype: torch.dtype = torch.float32, license: str | None = None
) -> Path:
    """A training checkpoint as a Hub-ready folder; the card's facts come from its run (config, trainer state,
    RUN_DIR/eval/step-N.json)."""
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    model = model_from_checkpoint(checkpoint)
    run_config = run_config_path(checkpoint)
    cfg = load_config(run_config) if is_plain_file(run_config) else None
    clear_previous_export(out_dir, checkpoint)
    tokenizer = _write_run_tokenizer(cfg, out_dir) if cfg else None
    if cfg is None:
        print(
            f"warning: {run_config} not found; the export has no tokenizer.json (pass --tokenizer to ladder-eval)",
            file=sys.stderr,
        )
    facts = _run_facts(checkpoint, cfg, model, out_dir.name, dtype)
    facts.license = license or (source_license(Path(facts.base_model)) if facts.base_model else None) or DEFAULT_LICENSE
    return _finish(model, out_dir, dtype, tokenizer, facts)


def export_folder(source: Path, out_dir: Path, dtype: torch.dtype = torch.float32, license: str | None = None) -> Path:
    """A Hugging Face format folder (a pretrained Llama, or an earlier export) as a Hub-ready folder: the weights
    re-saved in ``dtype``, its tokenizer files and bos/eos carried over, its licence kept unless one is given."""
    source, out_dir = Path(source), Path(out_dir)
    model = load_model(source)
    clear_previous_export(out_dir, source)
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG, GENERATION_CONFIG):
        if is_plain_file(source / name):
            copy_to(source / name, out_dir / name)
    tokenizer = _read_tokenizer(out_dir / TOKENIZER_FILE)
    facts = CardFacts(
        name=out_dir.name,
        args=model.args,
        dtype=_dtype_name(dtype),
        license=license or source_license(source) or DEFAULT_LICENSE,
        tokenizer=f"{TOKENIZER_FILE} of {source}" if tokenizer else None,
        base_model=str(source),
    )
    return _finish(model, out_dir, dtype, tokenizer, facts)


def source_kind(source: Path) -> str:
    """``"export"`` or ``"checkpoint"``: what ``source`` is, as load_model reads it (an explicit folder, never a
    guess). Anything else is an InputError saying what to give instead; a run folder (or its checkpoints/) names
    its checkpoints, the newest complete first, rather than exporting one the user did not name."""
    kind = folder_kind(source)
    if kind in ("export", "checkpoint"):
        return kind
    if kind == "incomplete checkpoint":
        newest = complete_checkpoints(source.parent)
        beside = f"; the newest complete one beside it is {newest[-1]}" if newest else ""
        raise InputError(
            f"{source}: not a complete checkpoint (no {COMPLETE_MARKER} marker: its save never finished){beside}"
        )
    folder = source / "checkpoints" if (source / "checkpoints").is_dir() else source
    steps = [path for path in folder.iterdir() if path.is_dir() and step_number(path) is not None]
    if not steps:
        raise InputError(
            f"{source}: neither a training checkpoint (RUN_DIR/checkpoints/step-N) nor a Hugging Face format folder "
            f"({CONFIG_JSON} + {WEIGHTS_FILE} or {INDEX_FILE})"
        )
    complete = complete_checkpoints(folder)
    names = ", ".join(p.name for p in complete[-3:][::-1]) + (
        f" and {len(complete) - 3} older" if len(complete) > 3 else ""
    )
    incomplete = len(steps) - len(complete)
    found = f"complete: {names or 'none'}" + (f"; {incomplete} incomplete" if incomplete else "")
    advice = f"export one of its checkpoints, e.g. {complete[-1]}" if complete else "it has no complete checkpoint"
    raise InputError(f"{source}: a run's folder, not a checkpoint: {advice} ({found})")


def overwrite_obstacle(out_dir: Path) -> str | None:
    """What in ``out_dir`` an export cannot replace or would leave wrong, or None: something other than a file
    where an export file goes, or a shard index (loaders read the shards it lists, not the new weights)."""
    for name in EXPORT_FILES:
        path = out_dir / name
        if path.is_symlink() or (path.exists() and not path.is_file()):
            what = "symbolic link" if path.is_symlink() else "folder" if path.is_dir() else "special file"
            return f"{path}: a {what} is where the export writes its {name}; move it away (only files are replaced)"
    if (out_dir / INDEX_FILE).exists():
        return (
            f"{out_dir / INDEX_FILE}: a sharded model's index, which loaders would read instead of the export's "
            f"{WEIGHTS_FILE}; remove it and its shards, or export elsewhere"
        )
    return None


def clear_previous_export(out_dir: Path, source: Path) -> None:
    """Make ``out_dir`` ready for an export's files: created if need be, and an earlier export's files removed, so
    none of them (a tokenizer, a generation config) mixes into this one. Anything else in it stays."""
    if out_dir.resolve() == source.resolve():
        raise InputError(f"{out_dir}: the export cannot replace its own source; write it elsewhere")
    problem = overwrite_obstacle(out_dir) if out_dir.is_dir() else None
    if problem:
        raise InputError(problem)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in EXPORT_FILES:
        remove_written(out_dir / name)


def _finish(model, out_dir: Path, dtype: torch.dtype, tokenizer, facts: CardFacts) -> Path:
    """The weights and config.json with the token ids generation uses, generation_config.json, the card."""
    token_ids = _token_ids(out_dir, tokenizer, model.args.vocab_size) if tokenizer else None
    save_export(model, out_dir, dtype, token_ids)
    if token_ids:
        generation = {**read_optional_json(out_dir / GENERATION_CONFIG), **token_ids}
        write_text(out_dir / GENERATION_CONFIG, json.dumps(generation, indent=2) + "\n")
    write_model_card(out_dir, facts, sum(p.numel() for p in model.parameters()))
    return out_dir


def _token_ids(out_dir: Path, tokenizer, vocab_size: int) -> dict:
    """bos / eos / pad ids: eos is what ladder-generate stops at in this folder (tokenizer_config.json's eos_token,
    else generation_config.json's, else <|endoftext|>); bos is tokenizer_config.json's or the source's, else eos.
    A folder without tokenizer_config.json gets one naming the eos token, so AutoTokenizer knows it too."""
    eos, _ = stop_tokens(out_dir, tokenizer, vocab_size)
    if not eos:
        return dict(DEFAULT_TOKEN_IDS)
    tokenizer_config = read_optional_json(out_dir / TOKENIZER_CONFIG)
    bos_text = token_text(tokenizer_config.get("bos_token"))
    bos = (
        tokenizer.token_to_id(bos_text)
        if bos_text
        else read_optional_json(out_dir / GENERATION_CONFIG).get("bos_token_id")
    )
    if not tokenizer_config:
        minimal = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tokenizer.id_to_token(eos[0])}
        write_text(out_dir / TOKENIZER_CONFIG, json.dumps(minimal, indent=2) + "\n")
    return {
        "bos_token_id": eos[0] if bos is None else bos,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": eos[0],
    }


def _write_run_tokenizer(cfg, out_dir: Path):
    """The run's tokenizer.json and the tokenizer_config.json it took its chat format from; None (with a
    warning) when the tokenizer cannot be had, e.g. a hub tokenizer on an offline machine: the weights still
    export."""
    try:
        tokenizer = load_tokenizer(cfg.data.tokenizer)
    except DataError as err:
        print(f"warning: the export has no tokenizer.json ({err})", file=sys.stderr)
        return None
    try:
        tokenizer.save(str(refuse_link(out_dir / TOKENIZER_FILE)))
    except Exception as err:  # the tokenizers library's own error, which names its OS error only in its text
        raise os_error_of(err, out_dir / TOKENIZER_FILE) from None
    folder = run_tokenizer_config_folder(cfg.data)
    if folder is not None:  # a model adapted from a pretrained folder keeps its chat format and eos
        copy_to(folder / TOKENIZER_CONFIG, out_dir / TOKENIZER_CONFIG)
    return tokenizer


def _read_tokenizer(path: Path):
    if not is_plain_file(path):
        print(f"warning: {path.parent} gets no tokenizer.json: the source has none", file=sys.stderr)
        return None
    return load_tokenizer(str(path))


def _run_facts(checkpoint: Path, cfg, model, name: str, dtype: torch.dtype) -> CardFacts:
    state = read_trainer_state(checkpoint)
    facts = CardFacts(name=name, args=model.args, dtype=_dtype_name(dtype), steps=state.get("step"))
    facts.tokens = state.get("tokens_seen")
    if cfg is None:
        return facts
    data = cfg.data
    # a mixture of token folders (data.sources) has no data.source
    facts.data = data.source or ", ".join(f"{s.path} (weight {s.weight:g})" for s in data.sources)
    hub = f"config {data.hub_config}, " if data.hub_config and "/" in (data.source or "") else ""
    facts.data_detail = f" ({hub}split {data.split}, format {data.format})"
    facts.tokenizer = data.tokenizer
    facts.base_model = cfg.checkpoint.init_from
    facts.frozen_layers = cfg.train.freeze_layers
    run_dir = checkpoint.resolve().parent.parent  # RUN_DIR/checkpoints/step-N
    facts.evals, facts.eval_note = _run_evals(run_dir / "eval" / f"step-{facts.steps}.json")
    return facts


def _run_evals(path: Path) -> tuple[dict, str]:
    """The summary of the run's lm-eval results for this checkpoint's step, and where it came from."""
    if not is_plain_file(path):
        return {}, ""
    record = read_optional_json(path)
    summary = record.get("summary")
    if not isinstance(summary, dict):
        print(f"warning: {path}: no eval summary in it; the model card lists no eval results", file=sys.stderr)
    if not isinstance(summary, dict) or not summary:
        return {}, ""
    limit = record.get("limit")
    rows = f"the first {limit} rows of each task" if limit else "every row of each task"
    return summary, f"lm-eval through ladder-eval at this checkpoint's step, {rows} ({path.name} of the run)."


def _dtype_name(dtype: torch.dtype) -> str:
    return next((name for name, value in DTYPES.items() if value == dtype), str(dtype))
