"""Running a study's points: one after another on this machine (a finished run is skipped, a cut-off one resumes
from its newest checkpoint), or one point per Slurm array task (``slurm/study.sh`` asks ``--point I`` for the
overrides of its point). Every point's config is checked before the first run starts, and so is every point
folder that already holds a run: a run of another config there (another recipe, the recipe edited since) is refused,
never skipped as finished, resumed or collected as this study's (``identity.py``).

A study stops as a trainer does: SIGINT, SIGTERM, SIGUSR1 or SIGHUP to the study's pid asks its running trainer to
save a checkpoint and stop (SIGTERM to the trainer), starts no further point, and exits with the trainer's status
(75 once the checkpoint is saved). A killed study's trainer gets SIGTERM from the kernel (``end_with_parent``)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from ..config import load_config
from ..errors import InputError, Preempted, RunFailed
from ..files import copy_to, make_folder, open_to_write, refuse_link
from ..lifetime import PREEMPTION_SIGNALS, ends_with_this_process
from .grid import Point, fixed_overrides, grid
from .identity import CONFIG_FILE, differences, foreign_run, identity, refuse_duplicate_points, refuse_foreign_runs

FINISHED_FILE = "summary.json"  # the trainer sets its "finished" when a run reaches its last step
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
    """A recipe, the command's overrides, and the points they span. ``given``: overrides every point's trainer gets
    beyond its own that are no part of its folder name (benchmarks/gpu_study.py's for the machine: the dtype, a copied
    data folder); they are part of each point's identity."""

    def __init__(self, recipe: str, overrides: list[str], given: list[str] = ()):
        self.recipe, self.given = recipe, list(given)
        self.points = grid(overrides)
        base = load_config(recipe, fixed_overrides(overrides))
        self.dir = Path(base.run.dir)
        # every point must make a valid config before any run starts, and no two points one config
        configs = [load_config(recipe, [*point.run_overrides(self.dir), *self.given]) for point in self.points]
        self.identities = [identity(cfg) for cfg in configs]
        refuse_duplicate_points(self.points, self.identities)

    def refuse_foreign_runs(self, points: list[Point] | None = None) -> None:
        """InputError, one line, when a point's folder holds a run of another config (``identity.py``)."""
        chosen = self.points if points is None else points
        refuse_foreign_runs(self.dir, [(p.index, p.run_dir(self.dir), self.identities[p.index]) for p in chosen])

    def describe(self, sweep_args: list[str]) -> str:
        lines = [f"study {self.dir}: {len(self.points)} points of {self.recipe}"]
        for point in self.points:
            run_dir = point.run_dir(self.dir)
            other = foreign_run(run_dir, self.identities[point.index])
            state = f"holds {other}: refused" if other else status(run_dir)
            lines.append(f"{point.index:>4}  {point.name}  [{state}]")
        quoted = " ".join(shlex.quote(arg) for arg in sweep_args)
        lines.append(f"Slurm: sbatch --array=0-{len(self.points) - 1} slurm/study.sh {self.recipe} {quoted}")
        return "\n".join(lines)

    def point(self, index: int) -> Point:
        if not 0 <= index < len(self.points):
            raise InputError(
                f"--point {index}: study {self.dir} has {len(self.points)} points, numbered 0..{len(self.points) - 1}"
            )
        self.refuse_foreign_runs([self.points[index]])  # its trainer would resume or skip another config's run
        return self.points[index]

    def collect(self, dest: Path, overwrite: bool = False) -> list[Path]:
        """Copy each finished point's small results (RESULT_FILES and eval/*.json) to ``dest``/<point>/; points
        still running are left out. Returns the folders written. A finished run of another config in the study is
        refused (it is not this study's result); a point folder in ``dest`` that holds other files, or another run's
        results (a config.yaml not byte for byte this run's), is written into only with ``overwrite`` (its other files
        stay); a link where a copy goes is refused (files.py's rule); all are checked for every point before any
        copy."""
        # inside the study the copies would land on (or among) the files they are copied from
        if Path(dest).resolve().is_relative_to(self.dir.resolve()):
            raise InputError(
                f"--collect {dest}: it is inside the study's folder {self.dir}; choose a folder outside it"
            )
        self.refuse_foreign_runs([point for point in self.points if finished(point.run_dir(self.dir))])
        copies = []
        for point in self.points:
            run_dir = point.run_dir(self.dir)
            if finished(run_dir):
                results = sorted((run_dir / "eval").glob("*.json"))
                files = [(run_dir / name, name) for name in RESULT_FILES] + [(r, f"eval/{r.name}") for r in results]
                copies.append((Path(dest) / point.name, files))
                _check_point_folder(dest, *copies[-1], overwrite)
        for out, files in copies:
            make_folder(out)
            if any("/" in name for _, name in files):
                make_folder(out / "eval")
            for source, name in files:
                copy_to(source, out / name)
        return [out for out, _ in copies]

    def run_all(self) -> None:
        """Run the unfinished points in order, until one fails or a signal stops the study (module docstring)."""
        self.refuse_foreign_runs()  # before any point runs
        stop = _StopRequest()
        previous = {sig: signal.signal(sig, stop.receive) for sig in PREEMPTION_SIGNALS}
        try:
            for point in self.points:
                run_dir = point.run_dir(self.dir)
                if finished(run_dir):
                    print(f"study: [{point.index}] {point.name}: finished, skipped", flush=True)
                    continue
                if stop.signal is not None:
                    raise Preempted(
                        f"stopped by {stop.signal.name} before point {point.index} ({point.name}); "
                        "run the study again to go on"
                    )
                print(f"study: [{point.index}] {point.name}: {status(run_dir)}", flush=True)
                self._run_point(point, stop)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_point(self, point: Point, stop: _StopRequest) -> None:
        run_dir = make_folder(point.run_dir(self.dir))  # the point's folder, never a link planted in the study
        cmd = [sys.executable, "-m", "ladder_train.train", "--config", self.recipe, *point.run_overrides(self.dir)]
        # unbuffered: the log keeps every line up to a kill; wandb groups the study's runs
        group = os.environ.get("WANDB_RUN_GROUP", self.dir.name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_RUN_GROUP": group}
        # the trainer writes its own log (it outlives a killed study long enough to save); the study echoes it
        log_path = run_dir / "train.log"
        with open_to_write(log_path, "a") as log, open(log_path) as echo:
            echo.seek(0, os.SEEK_END)
            child = _start_trainer(cmd, log, env)
            stop.attach(child)
            code = None
            try:
                while code is None:
                    try:
                        code = child.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
                    sys.stdout.write(echo.read())
                    sys.stdout.flush()
            finally:
                stop.detach()  # the trainer has ended, or the study is failing and waits for it to save and stop
        if code == 75 or code == -signal.SIGTERM:  # -SIGTERM: stopped before its training loop began
            cause = f" by {stop.signal.name}" if stop.signal is not None else ""
            raise Preempted(
                f"point {point.index} ({point.name}) stopped{cause}; run the study again to go on "
                "(it resumes from its newest checkpoint)"
            )
        if code != 0 or not finished(run_dir):
            raise RunFailed(
                f"point {point.index} ({point.name}) failed with exit status {code}; its log: {run_dir}/train.log"
            )


def _check_point_folder(dest: Path, out: Path, files: list[tuple[Path, str]], overwrite: bool) -> None:
    """``--collect``'s point folder ``out`` may take ``files``: no link where a copy or its folder goes, and
    nothing but collect's own files of the same run in it unless ``overwrite``."""
    for path in (out, out / "eval", *(out / name for _, name in files)):
        refuse_link(path, "a --collect copy")
    for path in (out, out / "eval"):
        if path.exists() and not path.is_dir():
            raise InputError(f"--collect {dest}: {path} is not a folder, where collect writes one; move it elsewhere")
    for path in (out / name for _, name in files):
        if path.is_dir():
            raise InputError(f"--collect {dest}: {path} is a folder, where collect copies a file; move it elsewhere")
    if overwrite or not out.is_dir():
        return
    theirs = [p.name for p in out.iterdir() if p.name not in RESULT_FILES and p.name != "eval"]
    if (out / "eval").is_dir():
        theirs += [f"eval/{p.name}" for p in (out / "eval").iterdir() if p.suffix != ".json"]
    if theirs:
        shown = ", ".join(sorted(theirs)[:5]) + (f" and {len(theirs) - 5} more" if len(theirs) > 5 else "")
        raise InputError(
            f"--collect {dest}: {out} holds files study --collect does not write ({shown}); pass --overwrite to "
            "write its files beside them, or choose another folder"
        )
    other = _other_results(out, dict((name, path) for path, name in files)[CONFIG_FILE])
    if other:
        raise InputError(
            f"--collect {dest}: {out} holds {other}; pass --overwrite to replace them, or choose another folder"
        )


def _other_results(out: Path, source: Path) -> str | None:
    """What ``out`` holds when that is another run's results: any of collect's files there, and a config.yaml that is
    not ``source``, byte for byte (the same run collected again refreshes its copies)."""
    present = [name for name in RESULT_FILES if (out / name).exists()]
    present += [f"eval/{p.name}" for p in sorted(out.glob("eval/*.json"))]
    if not present:
        return None
    there = out / CONFIG_FILE
    if not there.is_file():  # a link there was refused before; a FIFO or folder is not a file
        return f"results without a {CONFIG_FILE} ({', '.join(present)}), whose run cannot be told"
    if there.read_bytes() == source.read_bytes():
        return None
    try:
        changed = differences(identity(load_config(there)), identity(load_config(source)))
    except InputError:  # ConfigError too: a config.yaml that does not read as one is another run's all the same
        changed = "not read as a config"
    how = f"of another config: {changed}" if changed else "of this config from another run folder"
    return f"another run's results (its {CONFIG_FILE} is not {source}'s, {how})"


def _start_trainer(cmd: list[str], log, env: dict[str, str]) -> subprocess.Popen:
    """The trainer, writing to ``log``; the kernel sends it SIGTERM if the study dies (even by SIGKILL)."""
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=ends_with_this_process(signal.SIGTERM),
    )


class _StopRequest:
    """The study's handler of the preemption signals: it remembers the first and passes it on to the running trainer
    once, as SIGTERM. Not the signal itself: after a Ctrl-C at the terminal, which reaches the trainer directly too, a
    second SIGINT would tell the trainer to stop without saving."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self._child: subprocess.Popen | None = None
        self._passed_on = False

    def receive(self, signum: int, frame) -> None:
        if self.signal is None:
            self.signal = signal.Signals(signum)
        self._pass_on()

    def attach(self, child: subprocess.Popen) -> None:
        """The trainer just started; a signal that came while it was starting is passed on now."""
        self._child, self._passed_on = child, False
        self._pass_on()

    def detach(self) -> None:
        """Forget the trainer once it has ended; one still running (the study is failing) is stopped first, so that
        no trainer outlives its study."""
        child = self._child
        if child is not None and child.poll() is None:
            if not self._passed_on:
                self._passed_on = True
                child.send_signal(signal.SIGTERM)
            child.wait()
        self._child = None

    def _pass_on(self) -> None:
        if self.signal is not None and self._child is not None and not self._passed_on:
            self._passed_on = True
            self._child.send_signal(signal.SIGTERM)
