"""Running a study's points: one after another on this machine (a finished run is skipped, a cut-off one resumes
from its newest checkpoint), or one point per Slurm array task (``slurm/study.sh`` asks ``--point I`` for the
overrides of its point). Every point's config is checked before the first run starts."""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from ..config import load_config
from ..errors import Preempted, RunFailed
from ..lifetime import end_with_parent
from .grid import Point, fixed_overrides, grid

FINISHED_FILE = "summary.json"  # the trainer writes it when a run reaches its last step
# what a finished run's figures rest on: kilobytes, committed beside the tables made from them (no weights)
RESULT_FILES = ("config.yaml", "metrics.jsonl", FINISHED_FILE)


def finished(run_dir: Path) -> bool:
    path = run_dir / FINISHED_FILE
    try:
        return bool(json.loads(path.read_text()).get("finished"))
    except (OSError, ValueError):
        return False


def status(run_dir: Path) -> str:
    if finished(run_dir):
        return "finished"
    steps = [int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()]
    return f"resumes at step {max(steps)}" if steps else "new"


class Study:
    """A recipe, the command's overrides, and the points they span."""

    def __init__(self, recipe: str, overrides: list[str]):
        self.recipe = recipe
        self.points = grid(overrides)
        base = load_config(recipe, fixed_overrides(overrides))
        self.dir = Path(base.run.dir)
        # every point must make a valid config before any run starts
        for point in self.points:
            load_config(recipe, point.run_overrides(self.dir))

    def describe(self, sweep_args: list[str]) -> str:
        lines = [f"study {self.dir}: {len(self.points)} points of {self.recipe}"]
        for point in self.points:
            lines.append(f"{point.index:>4}  {point.name}  [{status(point.run_dir(self.dir))}]")
        quoted = " ".join(shlex.quote(arg) for arg in sweep_args)
        lines.append(f"Slurm: sbatch --array=0-{len(self.points) - 1} slurm/study.sh {self.recipe} {quoted}")
        return "\n".join(lines)

    def point(self, index: int) -> Point:
        if not 0 <= index < len(self.points):
            raise RunFailed(f"study {self.dir}: point {index} does not exist (0..{len(self.points) - 1})")
        return self.points[index]

    def collect(self, dest: Path) -> list[Path]:
        """Copy each finished point's small results (RESULT_FILES and eval/*.json) to ``dest``/<point>/; points
        still running are left out. Returns the folders written."""
        written = []
        for point in self.points:
            run_dir = point.run_dir(self.dir)
            if not finished(run_dir):
                continue
            out = Path(dest) / point.name
            (out / "eval").mkdir(parents=True, exist_ok=True)
            for name in RESULT_FILES:
                shutil.copy2(run_dir / name, out / name)
            for result in sorted((run_dir / "eval").glob("*.json")):
                shutil.copy2(result, out / "eval" / result.name)
            if not any((out / "eval").iterdir()):
                (out / "eval").rmdir()
            written.append(out)
        return written

    def run_all(self) -> None:
        for point in self.points:
            run_dir = point.run_dir(self.dir)
            if finished(run_dir):
                print(f"study: [{point.index}] {point.name}: finished, skipped", flush=True)
                continue
            print(f"study: [{point.index}] {point.name}: {status(run_dir)}", flush=True)
            self._run_point(point)

    def _run_point(self, point: Point) -> None:
        run_dir = point.run_dir(self.dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "ladder_train.train", "--config", self.recipe, *point.run_overrides(self.dir)]
        # unbuffered: the log keeps every line up to a kill; wandb groups the study's runs
        group = os.environ.get("WANDB_RUN_GROUP", self.dir.name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_RUN_GROUP": group}
        # the trainer writes its own log (it outlives a killed study long enough to save); the study echoes it
        log_path = run_dir / "train.log"
        with open(log_path, "a") as log, open(log_path) as echo:
            echo.seek(0, os.SEEK_END)
            child = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=functools.partial(end_with_parent, os.getpid(), signal.SIGTERM),
            )
            code = None
            while code is None:
                try:
                    code = child.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                except KeyboardInterrupt:  # Ctrl-C reached the trainer too (one process group): let it save
                    code = child.wait()
                sys.stdout.write(echo.read())
                sys.stdout.flush()
        if code == 75 or code == -signal.SIGTERM:
            raise Preempted(
                f"point {point.index} ({point.name}) stopped with a checkpoint; run the study again to go on"
            )
        if code != 0 or not finished(run_dir):
            raise RunFailed(
                f"point {point.index} ({point.name}) failed with exit status {code}; its log: {run_dir}/train.log"
            )
