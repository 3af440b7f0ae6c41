"""A layout study's runs on one GPU, several at once (issue 42: the small study's pairs in minutes, bf16), on a bare,
offline machine that received the checkout with ``.gpu/`` (``bash benchmarks/gpu_prepare.sh``):

    python -m benchmarks.gpu_study --out DIR --jobs 8 --budget-s 420 \\
        --study "recipes/study_small.yaml model.residual=standard train.optimizer.lr=8e-3 run.seed=3,4,5 run.dir=runs/gpu_seeds" \\
        --study "recipes/study_small.yaml model.residual=ladder train.optimizer.lr=8e-3 run.seed=3,4,5 run.dir=runs/gpu_seeds"
    python -m benchmarks.gpu_study --tiny --out /tmp/s --study "..." --set train.max_steps=3   # the CPU, a check

Each ``--study`` is what ``ladder-train study --config`` takes (a recipe, then ``key=a,b`` overrides); its points are
the study runner's (``ladder_train.study``), each trained by ``python -m ladder_train.train`` with the point's
overrides, then ``train.dtype=bf16`` (a GPU; ``--tiny``: fp32), ``.gpu/fineweb`` and ``.gpu/eval`` for the recipe's
``../shared/data/fineweb`` and ``../shared/eval`` where the machine has no ../shared, and every ``--set``. Up to ``--jobs`` trainers share the
GPU (a 0.9M-parameter model leaves it mostly idle); each is a process group killed at its limit, at the end or on
SIGTERM (``benchmarks/parts.py``). The studies' points start interleaved (each study's first point, then each one's
second, ...), so the arms of a comparison stay paired; no point starts after ``--budget-s`` seconds and is then
reported "not started".

Written under ``--out``: ``NAME/POINT/`` per finished point (the study runner's collect: config.yaml, metrics.jsonl,
summary.json: what ``ladder-report`` and ``docs_tables`` read), ``logs/POINT.log`` per trainer, and ``gpu_study.json``
(per point: outcome, seconds, final validation loss; the card, torch, date, command). A table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sys
import time
from pathlib import Path

from benchmarks.machine import GPU_DIR, child_env, ensure_imports, environment, work_folder
from benchmarks.parts import Part, describe_outcome, failure, run_parts, sigterm_interrupts
from benchmarks.records import config_override, read_jsonl

SUMMARY = "gpu_study.json"  # in --out: every point's outcome, seconds and final validation loss
# the ../shared folders recipes name, and their copies gpu_prepare.sh puts in .gpu/ for a machine without ../shared
SHARED_COPIES = {"../shared/data/fineweb": GPU_DIR / "fineweb", "../shared/eval": GPU_DIR / "eval"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of the collected runs, logs/ and gpu_study.json")
    p.add_argument("--study", action="append", required=True, help="RECIPE key=a,b ... (repeatable)")
    p.add_argument("--jobs", type=int, default=8, help="trainers at once (default 8)")
    p.add_argument("--budget-s", type=float, default=None, help="no point starts after this many seconds")
    p.add_argument("--run-limit-s", type=float, default=900, help="one trainer's time limit (default 900)")
    p.add_argument("--tiny", action="store_true", help="on the CPU, fp32, one thread per trainer: a check of this tool")
    p.add_argument("--set", action="append", default=[], type=config_override, metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def studies(args: argparse.Namespace, work: Path):
    """(name, Study whose folder is ``work``/name, its recipe) for every ``--study``; each point's config checked."""
    from ladder_train.study.grid import fixed_overrides
    from ladder_train.study.runner import Study

    found = []
    for text in args.study:
        recipe, *overrides = shlex.split(text)
        name = Path(dict(x.split("=", 1) for x in fixed_overrides(overrides)).get("run.dir", "study")).name
        kept = [x for x in overrides if not x.startswith("run.dir=")]  # the runs live in the work folder
        given = [*machine_overrides(recipe, args.tiny, args.set), *args.set]  # each point's run, beyond its own
        found.append((name, Study(recipe, [*kept, f"run.dir={work / name}"], given), recipe))
    return found


def machine_overrides(recipe: str, tiny: bool, given: list[str]) -> list[str]:
    """What this machine changes in every point: bf16 on a GPU, and each ../shared folder the recipe reads and this
    machine lacks replaced by its copy in .gpu/ (gpu_prepare.sh), unless ``given`` (the ``--set`` items) names it."""
    from ladder_train.config import load_config

    overrides = ["wandb.mode=disabled"] + ([] if tiny else ["train.dtype=bf16"])
    cfg = load_config(recipe, [])
    for key, (section, field) in {"data.source": ("data", "source"), "eval.local_data": ("eval", "local_data")}.items():
        value = getattr(getattr(cfg, section), field)
        if value not in SHARED_COPIES or Path(value).exists() or any(x.startswith(key + "=") for x in given):
            continue
        if not SHARED_COPIES[value].is_dir():
            raise SystemExit(
                f"gpu_study: {recipe} reads {value} ({key}), absent here, and so is {SHARED_COPIES[value]}"
            )
        overrides.append(f"{key}={SHARED_COPIES[value]}")
    return overrides


def final_val_loss(run_dir: Path) -> float | None:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "val_loss" in r]
    return rows[-1]["val_loss"] if rows else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    site = ensure_imports()
    work = work_folder(args.tiny)
    logs, summary_file = args.out / "logs", args.out / SUMMARY
    from ladder_train.errors import ConfigError, InputError
    from ladder_train.files import make_folder, refuse_link, write_text

    try:
        refuse_link(summary_file)  # before the runs, not once they are over
        make_folder(logs)
        found = studies(args, work)
        extras = {name: study.given for name, study, _ in found}
    except (ConfigError, InputError, SystemExit) as err:
        shutil.rmtree(work, ignore_errors=True)
        raise SystemExit(str(err) if isinstance(err, SystemExit) else f"gpu_study: error: {err}") from None
    parts = []
    for name, study, recipe in found:
        extra = extras[name]
        for point in study.points:
            argv_point = [sys.executable, "-m", "ladder_train.train", "--config", recipe]
            argv_point += [*point.run_overrides(study.dir), *extra]
            part = Part(f"{name}/{point.name}", "study", argv_point, args.run_limit_s, logs / f"{point.name}.log")
            part.info.update(study=name, run_dir=point.run_dir(study.dir), order=(point.index, len(parts)))
            parts.append(part)
    # the studies' points interleaved (each study's first, then each one's second, ...): a budget that cuts the
    # list leaves whole pairs when the studies are the arms of one comparison
    parts.sort(key=lambda part: part.info["order"][0])
    print(f"gpu_study: {len(parts)} runs of {len(found)} studies, {args.jobs} at once", flush=True)
    env = child_env(site, args.tiny)
    deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    try:
        with sigterm_interrupts():
            try:
                run_parts(parts, env, args.jobs, start_by=deadline)
            except KeyboardInterrupt:
                print("gpu_study: interrupted; every trainer stopped; the finished runs are kept", flush=True)
            for name, study, _ in found:
                study.collect(args.out / name)
    finally:
        rows = [point_row(part) for part in parts]
        shutil.rmtree(work, ignore_errors=True)
    env_row = environment(argv, started, args.tiny, module="benchmarks.gpu_study")
    summary = {"env": env_row, "runs": rows}
    try:
        write_text(summary_file, json.dumps(summary, indent=1) + "\n")
    except InputError as err:  # a link put there while the runs ran
        raise SystemExit(f"gpu_study: error: {err}") from None
    print(f"{'run':<90} {'outcome':<26} {'s':>6}  val loss")
    for r in rows:
        loss = "-" if r["final_val_loss"] is None else f"{r['final_val_loss']:.4f}"
        print(f"{r['run']:<90} {r['outcome']:<26} {r['wall_s']:>6.0f}  {loss}")
    return 0 if all(r["finished"] for r in rows) else 1


def point_row(part) -> dict:
    from ladder_train.study.runner import finished

    run_dir = part.info["run_dir"]
    started = bool(part.outcome) and not part.outcome.get("not_started")
    if not part.outcome:
        outcome = "not started"
    elif not started:
        outcome = "not started (budget)"
    else:
        outcome = describe_outcome(part.outcome)
    done = finished(run_dir)
    return {
        "run": part.name,
        "finished": done,
        "outcome": outcome,
        "wall_s": part.outcome.get("wall_s", 0.0),
        "final_val_loss": final_val_loss(run_dir) if done else None,
        "error": failure(part) if started and not done else None,
        "command": shlex.join(["python", *part.argv[1:]]),
    }


if __name__ == "__main__":
    sys.exit(main())
