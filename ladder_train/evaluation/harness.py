"""The lm-eval harness over the project's model: ``evaluate`` runs lm-eval tasks on a model in this process and
writes, prints and returns the results.

The trainer calls it on rank 0 with the gathered (unsharded) model when training ends; ``ladder-eval``
calls it on a loaded export or checkpoint. Everything that can be checked (task names, local data files, include paths,
tokenizer) is checked before any data is loaded or any token is scored.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from pathlib import Path
from unittest import mock

import lm_eval
from datasets.exceptions import DatasetNotFoundError
from lm_eval.utils import handle_non_serializable

from ..files import write_text
from ..model.presets import PRESETS
from .adapter import EvalError, LadderLM
from .results import averages, format_table, paper_results, summarize
from .task_registry import check_local_data, materialise_local_tasks, task_manager_for, unavailable_data_message

log = logging.getLogger(__name__)

_SHAPE_KEYS = ("n_layers", "dim", "n_heads", "ffn_dim")


def preset_name(args) -> str | None:
    """The paper size whose shape the model has (1.2B, 3.5B, ...), for the comparison with its numbers."""
    for name, shape in PRESETS.items():
        if all(getattr(args, key) == shape[key] for key in _SHAPE_KEYS):
            return name
    return None


def residual_name(args) -> str:
    """The layout as the paper names it; a hybrid ladder (only the last N layers) has no paper numbers."""
    if args.residual == "ladder" and args.ladder_layers not in (None, args.n_layers):
        return f"ladder-last-{args.ladder_layers}"
    return args.residual


def evaluate(
    model,
    tokenizer,
    tasks: list[str],
    include_path: str | Path | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    out_path: str | Path | None = None,
    model_name: str | None = None,
    residual: str | None = None,
    local_data: str | Path | None = None,
    max_length: int | None = None,
    device=None,
    bootstrap_iters: int = 1000,
    print_table: bool = True,
) -> dict[str, dict[str, float]]:
    """Evaluate ``model`` (a plain ``Transformer``) on lm-eval ``tasks``; returns ``{task: {metric: value}}``.

    ``include_path``: a folder of the user's own task YAMLs. ``local_data``: a folder with local copies of eval
    sets (the layout of ../shared/eval) for the project's ``*_local`` tasks. ``out_path``: where the JSON goes
    (lm-eval's results plus our summary). ``model_name`` / ``residual`` pick the paper's numbers shown beside
    ours; by default they are read from the model's shape and layout. Raises EvalError on bad input.
    """
    tasks = [name.strip() for name in tasks if name.strip()]
    if not tasks:
        raise EvalError("no eval tasks given")
    if limit is not None and limit <= 0:
        raise EvalError(f"limit must be a positive number of rows per task, got {limit}")
    model_name = model_name or preset_name(model.args)
    residual = residual or residual_name(model.args)
    check_local_data(tasks, local_data)
    lm = LadderLM(model, tokenizer, batch_size=batch_size, max_length=max_length, device=device)
    output = _simple_evaluate(lm, tasks, include_path, local_data, limit, bootstrap_iters)
    summary = summarize(output["results"])
    if out_path is not None:
        _write_results(Path(out_path), output, model.args, model_name, residual, tasks, limit, summary)
    if print_table:
        print(format_table(summary, model_name, residual), flush=True)
    return summary


def _simple_evaluate(lm, tasks: list[str], include_path, local_data, limit, bootstrap_iters: int) -> dict:
    """lm-eval's simple_evaluate over the built-in tasks, the user's YAMLs and the local tasks' YAMLs (written
    to a scratch folder for the run)."""
    with tempfile.TemporaryDirectory(prefix="ladder-eval-tasks-") as scratch:
        include_paths = [Path(include_path)] if include_path is not None else []
        if local_data is not None:
            include_paths.insert(0, materialise_local_tasks(local_data, Path(scratch)))
        manager = task_manager_for(tasks, include_paths)
        try:
            with _bootstrap_in_process():
                return lm_eval.simple_evaluate(
                    model=lm,
                    tasks=tasks,
                    task_manager=manager,
                    limit=limit,
                    bootstrap_iters=bootstrap_iters,
                    log_samples=False,
                )
        except (ConnectionError, DatasetNotFoundError) as err:  # the Hub cannot be reached (offline)
            raise EvalError(unavailable_data_message(err, tasks, manager)) from None


def _bootstrap_in_process():
    """lm-eval bootstraps a metric's stderr (perplexities) in a forked multiprocessing pool unless DISABLE_MULTIPROC is
    set. Forking a process that runs threads (torch's, the data loader's) can leave a child holding a lock no thread
    will release: a study run hung there after its last evaluation. One bootstrap chunk is cheap in process."""
    return mock.patch.dict(os.environ, {"DISABLE_MULTIPROC": "1"})


def _write_results(
    out_path: Path, output: dict, args, model_name, residual, tasks: list[str], limit, summary: dict
) -> None:
    """The results JSON: lm-eval's results plus our summary, averages and the paper's numbers."""
    record = {
        "model": {"name": model_name, "residual": residual, "args": dataclasses.asdict(args)},
        "tasks": tasks,
        "limit": limit,
        "summary": summary,
        "averages": averages(summary),
        "paper": paper_results(model_name, residual),
        "lm_eval": {
            key: output[key]
            for key in ("results", "groups", "configs", "versions", "n-shot", "n-samples", "config")
            if key in output
        },
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_text(out_path, json.dumps(record, indent=2, default=handle_non_serializable) + "\n")
