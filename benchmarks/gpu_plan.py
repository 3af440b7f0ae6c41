"""What one gpu_check invocation runs, and where: the mode (a GPU's settings or ``--tiny``'s), each training run's
command (its recipe, the mode's and the invocation's overrides, the data), its dry-run plan, and the parts in the order
they run (ceilings, training with each variant, profile, big, the peers, decode).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import peers
from benchmarks.gpu_rows import reached_step
from benchmarks.machine import GPU_DIR
from benchmarks.parts import REPO, Part

SHARED = Path(os.environ.get("LADDER_SHARED", REPO.parent / "shared"))


class Refused(Exception):
    """Bad input, or a machine that lacks what the check needs: one line, ``gpu_check: error: ...``, exit 2, before
    any part runs."""


LAYOUTS = ("standard", "parallel", "ladder")


@dataclass(frozen=True)
class Mode:
    """The settings of the GPU check or of ``--tiny``."""

    name: str
    global_batch: int
    compile: bool
    skip: int  # steps left out of the medians (compilation, first allocations)
    profile: tuple[int, int, int]  # profile.wait, warmup, active
    shrink: tuple[str, ...]  # overrides every training run and plan gets (the tiny model)
    decode: tuple[str, ...]  # ladder-bench flags beside --set n_layers, --layouts and --out
    decode_set: tuple[str, ...]
    ceilings: tuple[str, ...]  # benchmarks/gpu_ceilings.py's sizes
    big: tuple[str, ...]  # the --big run's own overrides
    limits: dict = field(default_factory=dict)  # seconds per part kind
    jobs: int = 1  # measured parts at once (the GPU: one)


GPU = Mode(
    name="gpu",
    global_batch=16,
    compile=True,
    skip=5,
    profile=(5, 2, 3),
    shrink=(),
    decode=tuple("--model 1.2B --compile on --warmup 2 --runs 5 --prompt-len 512 --gen-len 256".split()),
    decode_set=(),
    ceilings=(),
    big=("train.global_batch_size=4", "train.micro_batch_size=1", "train.max_steps=4", "parallel.compile=false"),
    limits={"plan": 180, "ceilings": 60, "train": 300, "profile": 360, "decode": 420, "big": 300},
)


TINY = Mode(
    name="tiny",
    global_batch=4,
    compile=False,
    skip=1,
    profile=(1, 1, 3),
    shrink=("model.preset=tiny", "data.seq_len=64", "data.num_workers=0"),
    decode=tuple("--model tiny --compile off --warmup 1 --runs 2 --prompt-len 16 --gen-len 8".split()),
    decode_set=("vocab_size=257",),
    ceilings=("--copy-mib", "16", "--matmul", "256"),
    big=("model.preset=small", "train.global_batch_size=4", "train.micro_batch_size=1", "train.max_steps=3"),
    limits={"plan": 120, "ceilings": 60, "train": 120, "profile": 120, "decode": 120, "big": 120},
    jobs=3,
)


@dataclass
class Plan:
    """What one invocation runs, and where."""

    mode: Mode
    work: Path
    logs: Path
    data: list[str]  # data.source / data.tokenizer overrides
    args: argparse.Namespace

    def train_argv(self, recipe: str, micro: int, steps: int, run_dir: Path, extra: tuple[str, ...] = ()) -> list[str]:
        """The trainer's command: each key once, ``extra`` (then the mode's) replacing the common settings."""
        mode = self.mode
        common = [
            *self.data,
            f"train.global_batch_size={mode.global_batch}",
            f"train.micro_batch_size={micro}",
            f"train.max_steps={steps}",
            "train.log_every=1",
            "train.schedule.warmup_steps=5",
            f"parallel.compile={str(mode.compile).lower()}",
            "eval.at_end=false",
            "eval.val_every=0",
            "checkpoint.every=0",
            "wandb.mode=disabled",
            f"run.dir={run_dir}",
            *mode.shrink,
            *self.args.set,
            *extra,
        ]
        overrides = dict(x.split("=", 1) for x in common)
        argv = [sys.executable, "-m", "ladder_train.train", "--config", recipe]
        return argv + [f"{key}={value}" for key, value in overrides.items()]

    def training(self, name: str, kind: str, recipe: str, micro: int, steps: int, extra=()) -> Part:
        run_dir = self.work / name
        return Part(
            name=name,
            kind=kind,
            argv=self.train_argv(recipe, micro, steps, run_dir, extra),
            limit_s=self.mode.limits[kind],
            log=self.logs / f"{name}.log",
            done=reached_step(run_dir / "metrics.jsonl", steps),
            info={"run_dir": run_dir, "micro_batch": micro, "recipe": recipe, "steps": steps},
        )

    def dry_run(self, part: Part) -> Part:
        argv = [*part.argv, "--dry-run", "--simulate", "1x1", "--json"]
        return Part(f"plan-{part.name}", "plan", argv, self.mode.limits["plan"], self.logs / f"plan-{part.name}.log")


def build_parts(plan: Plan) -> tuple[list[Part], list[Part], dict[str, Part]]:
    """(the plans, the measured parts in order, plan of each measured part by name)."""
    args, mode = plan.args, plan.mode
    measured: list[Part] = []
    ceilings_out = plan.work / "ceilings.jsonl"  # the card's copy rate and matrix-product rate, ~10 s
    ceilings_argv = [sys.executable, "-m", "benchmarks.gpu_ceilings", *mode.ceilings, "--out", str(ceilings_out)]
    measured.append(Part("ceilings", "ceilings", ceilings_argv, mode.limits["ceilings"], plan.logs / "ceilings.log"))
    measured[-1].info["out"] = ceilings_out
    for layout in args.layouts:
        for micro in args.micro:
            for i, variant in enumerate([[], *args.variant]):  # side by side: the run as it is, then each variant
                name = f"train-{layout}-mb{micro}" + (f"-v{i}" if i else "")
                part = plan.training(name, "train", f"recipes/{layout}_1b.yaml", micro, args.steps, tuple(variant))
                part.info.update(layout=layout, variant=variant)
                measured.append(part)
    if args.profile:
        wait, warmup, active = mode.profile
        steps = wait + warmup + active + 1  # the trace is written in step wait+warmup+active; one more, then stop
        knobs = ("profile.enabled=true", f"profile.wait={wait}", f"profile.warmup={warmup}", f"profile.active={active}")
        layout, micro = args.layouts[0], args.micro[0]
        part = plan.training(f"profile-{layout}-mb{micro}", "profile", f"recipes/{layout}_1b.yaml", micro, steps, knobs)
        part.info.update(layout=layout, profile=list(mode.profile))
        measured.append(part)
    # the 3.5B peak before decode: its compile time grows with --decode-layers, the least predictable part
    if args.big:
        steps = int(next(x for x in mode.big if x.startswith("train.max_steps=")).split("=")[1])
        part = plan.training("big-ladder-mb1", "big", "recipes/ladder_3b.yaml", 1, steps, mode.big)
        part.info["layout"] = "ladder"
        measured.append(part)
    measured += peers.parts(plan) if args.peers else []
    for tuning in args.gemv_tuning if args.decode_layers else ():  # --decode-layers 0: no decode part
        name = "decode" if tuning == "on" else f"decode-gemv-{tuning}"
        bench_out = plan.work / f"{name}.jsonl"
        decode_argv = [
            sys.executable,
            "-m",
            "ladder_train.bench",
            *mode.decode,
            "--tp",
            "1",
            "--batch-sizes",
            "1",
            "--set",
            f"n_layers={args.decode_layers}",
            *mode.decode_set,
            "--layouts",
            ",".join(args.decode_layouts or args.layouts),
            "--gemv-tuning",
            tuning,
            "--out",
            str(bench_out),
        ]
        measured.append(Part(name, "decode", decode_argv, mode.limits["decode"], plan.logs / f"{name}.log"))
        measured[-1].info["out"] = bench_out
    plans = {p.name: plan.dry_run(p) for p in measured if p.kind in ("train", "big")}
    return list(plans.values()), measured, plans


def data_overrides(args: argparse.Namespace) -> list[str]:
    """data.source / data.tokenizer (and the byte tokenizer's vocabulary) of every training run."""
    if args.tiny:
        fineweb = SHARED / "data" / "fineweb"
        source = args.tokens or (str(fineweb) if fineweb.is_dir() else "python-stdlib")
        tokenizer = args.tokenizer or "byte"
        return [f"data.source={source}", f"data.tokenizer={tokenizer}"] + (
            ["model.vocab_size=257"] if tokenizer == "byte" else []
        )
    tokens = Path(args.tokens) if args.tokens else GPU_DIR / "tokens"
    tokenizer = Path(args.tokenizer) if args.tokenizer else GPU_DIR / "tokenizer.json"
    if not (tokens / "ladder_tokens.json").is_file() or not tokenizer.is_file():
        raise Refused(
            f"no token folder at {tokens} or no tokenizer at {tokenizer}: run `bash "
            "benchmarks/gpu_prepare.sh` on the development machine and bring .gpu/ along"
        )
    return [f"data.source={tokens.resolve()}", f"data.tokenizer={tokenizer.resolve()}"]
