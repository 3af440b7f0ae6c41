"""Which lm-eval tasks exist and where their data comes from.

Three sources, resolved in this order:

1. the project's offline tasks (``tasks/*.yaml``), which read local copies of eval sets in the layout of
   ``../shared/eval``. Their YAML names the data folder as ``@LOCAL_DATA@``; :func:`materialise_local_tasks`
   writes them with the real folder into a temporary include directory;
2. the user's own task YAMLs (``include_path``), e.g. built-in tasks pointed at local files;
3. lm-eval's built-in tasks by name, whose data is downloaded from the Hugging Face Hub.

Every requested name is checked before any work starts: an unknown name lists the close matches and the
tasks this project documents; a local task without ``local_data`` or with a missing file is refused.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from lm_eval.tasks import TaskManager

from ..files import write_text
from ..paper import PAPER_TASKS
from .adapter import EvalError

TASKS_DIR = Path(__file__).parent / "tasks"
LOCAL_DATA_TOKEN = "@LOCAL_DATA@"

# the project's offline tasks -> the file each reads inside the local data folder
LOCAL_TASKS = {
    "arc_easy_local": "arc_easy.jsonl",
    "piqa_local": "piqa.jsonl",
    "openbookqa_local": "openbook_qa.jsonl",
    "lambada_local": "lambada_openai.jsonl",
    "wikitext2_local": "wikitext2/test.txt",
}
# built-in task -> the offline task over a local copy of the same set
LOCAL_ALTERNATIVES = {
    "arc_easy": "arc_easy_local",
    "piqa": "piqa_local",
    "openbookqa": "openbookqa_local",
    "lambada_openai": "lambada_local",
    "wikitext": "wikitext2_local",
}


def check_local_data(tasks: list[str], local_data: str | Path | None) -> None:
    """Refuse local tasks that have no data folder, or whose file is missing from it."""
    local = [name for name in tasks if name in LOCAL_TASKS]
    if not local:
        return
    if local_data is None:
        raise EvalError(
            f"task {local[0]!r} reads a local copy: pass --local-data DIR (evaluate(local_data=DIR)), a folder "
            f"holding {', '.join(LOCAL_TASKS[n] for n in local)} as in ../shared/eval"
        )
    for name in local:
        path = Path(local_data) / LOCAL_TASKS[name]
        if not path.is_file():
            raise EvalError(f"task {name!r} reads {path}, which does not exist (local data folder {local_data})")


def materialise_local_tasks(local_data: str | Path, dest: Path) -> Path:
    """Copy the project's task files into ``dest`` with the data folder written in; returns ``dest``."""
    folder = Path(local_data).resolve().as_posix()
    dest.mkdir(parents=True, exist_ok=True)
    for source in TASKS_DIR.iterdir():
        if source.is_file():
            write_text(dest / source.name, source.read_text().replace(LOCAL_DATA_TOKEN, folder))
    return dest


@functools.cache
def builtin_task_manager() -> TaskManager:
    """A TaskManager over lm-eval's built-in tasks (indexing them takes ~10 s, so once per process)."""
    return TaskManager(include_defaults=True)


def _unknown_task_message(name: str, known: set[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=4, cutoff=0.6)
    hint = f"close matches: {', '.join(close)}; " if close else ""
    documented = list(PAPER_TASKS) + list(LOCAL_TASKS)
    return (
        f"unknown eval task {name!r}; {hint}the paper's tasks and the local ones: {', '.join(documented)} "
        f"(lm-eval knows {len(known)} names; your own YAMLs go in --include-path DIR)"
    )


def task_manager_for(tasks: list[str], include_paths: list[Path]) -> TaskManager:
    """A TaskManager that knows every name in ``tasks``: over ``include_paths`` alone when they suffice
    (fast, fully offline), else with lm-eval's built-in tasks too. Unknown names raise EvalError."""
    for path in include_paths:
        if not path.is_dir():
            raise EvalError(f"include path {path} is not a folder of task YAMLs")
    local_names: set[str] = set()
    if include_paths:
        manager = TaskManager(include_path=[str(p) for p in include_paths], include_defaults=False)
        local_names = set(manager.all_tasks)
        if all(name in local_names for name in tasks):
            return manager
    builtin = builtin_task_manager()
    known = local_names | set(builtin.all_tasks)
    for name in tasks:
        if name not in known:
            raise EvalError(_unknown_task_message(name, known))
    if not include_paths:
        return builtin
    return TaskManager(include_path=[str(p) for p in include_paths], include_defaults=True)


def unavailable_data_message(err: Exception, tasks: list[str], manager: TaskManager) -> str:
    """One line for a built-in task whose dataset cannot be downloaded (offline, or no network)."""
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    culprits = []
    for name in tasks:
        entry = manager.task_index.get(name)
        dataset = (entry.cfg or {}).get("dataset_path") if entry is not None else None
        if dataset and dataset in str(err):
            culprits.append(f"{name!r} (dataset {dataset})")
    which = ", ".join(culprits) or ", ".join(repr(t) for t in tasks if t not in LOCAL_TASKS)
    local = [LOCAL_ALTERNATIVES[t] for t in tasks if t in LOCAL_ALTERNATIVES]
    local_hint = f" ({', '.join(local)})" if local else ""
    return (
        f"eval task {which}: data cannot be downloaded here ({reason}); evaluate offline instead with local "
        f"copies: --local-data DIR and the *_local tasks{local_hint}, or your own task YAMLs that read local "
        f"files via --include-path DIR (eval.include_path)"
    )
