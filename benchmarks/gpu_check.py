"""The project on one GPU in one command, on a bare, offline machine (issue 40): training tokens/s, MFU and peak
memory per layout and micro-batch against the ``--dry-run`` plan, a profiled step summarised, compiled decode.

    bash benchmarks/gpu_prepare.sh        # on the development machine, from the root: .gpu/ (tokens, tokenizer, wheels)
    python -m benchmarks.gpu_check --out docs/results/gpu [--layouts standard,parallel,ladder] [--micro 2,4]
        [--steps 20] [--profile] [--decode-layers 8] [--big] [--keep-trace] [--variant KEY=VALUE[,KEY=VALUE] ...]
        [--set KEY=VALUE ...]
    python -m benchmarks.gpu_check --tiny --out /tmp/gpu-tiny    # the same parts on the CPU with a tiny model

Each part is a subprocess in its own process group with a time limit; the group is killed when the part ends, stops
early or runs out of time, so no process outlives it (Ctrl-C / SIGTERM stop the running parts the same way).
Run folders live in a temporary folder (in /dev/shm when it has room) removed at the end. Before any part runs, every
training run's config (its recipe with ``--set`` and its ``--variant``) is loaded as the trainer would load it: a key
or value the trainer would refuse is one line, ``gpu_check: error: ...``, exit 2, nothing run.

In this order:
- plans: ``ladder-train ... --dry-run --simulate 1x1 --json`` of every training run; its memory totals (GiB) with
  sharded and with unsharded gradient accumulation. CPU only: they run together before anything is measured.
- ceilings: ``benchmarks/gpu_ceilings.py``, the card's device-to-device copy rate and bf16 matrix-product rate
  (decode's bandwidth and MFU are read against them).
- training: per layout and micro-batch, ``recipes/{layout}_1b.yaml`` (the 1.2B preset, seq 2048) on the token folder,
  global batch 16, compiled, ``--steps`` steps logged every step. Row: tokens/s median and range and MFU median
  over the steps after the first ``--skip`` (compilation), peak memory, and the plan's total for the accumulation
  the run used (its "FSDP gradients:" line) with the plan's relative error (plan - peak) / peak. A run is stopped
  once its last step is logged: its final checkpoint (14 GB at 1.2B) is not waited for. Each ``--variant`` runs
  every one of them again right after it with its overrides (e.g. ``parallel.blocks_per_fsdp_unit=4``): a setting's
  before and after side by side on one card; rows carry the variant's overrides.
- ``--profile``: the first layout and micro-batch again under ``profile.enabled`` (wait 5, warm-up 2, active 3:
  RUN_DIR/profile/rank0_steps8-10.pt.trace.json), summarised by ``ladder_train/train/trace_summary.py``: the GPU's
  busy share of the traced span (the union of kernel, memcpy and memset intervals over first start to last end),
  kernels, copies, memsets and CUDA runtime calls per optimizer step, the top kernels by GPU time.
- ``--big``: ``recipes/ladder_3b.yaml`` (3.5B) at micro-batch 1, global batch 4, eager, 4 steps: peak memory
  against its plan.
- decode (``--decode-layers 0``: none): ``ladder-bench --model 1.2B --set n_layers=D --tp 1 --compile on`` (prompt
  512, 256 new tokens, batch 1, 2 warm-up and 5 timed runs) per layout of ``--decode-layouts`` (default
  ``--layouts``), once per ``--gemv-tuning`` value (default on and off, side by side: ladder-bench's switch of the
  decode step's matrix-vector products to tuned Triton reductions); row: TPOT (the median decode step) and the
  weights' read bandwidth, parameters (``count_params``) x 2 bytes (bf16) / TPOT. Last: its compile time grows
  with the layers.
- ``--peers``, before decode: torchtitan training the standard recipe's shape and our model in a bare loop at each
  ``--micro``, transformers decoding our export of the decode part's model (``benchmarks/peers.py``); their rows
  carry ours / theirs from this invocation's rows.

Rows (``kind`` ceilings / train / profile / big / decode / peer_train / bare_loop / peer_decode, each with ``env``:
card, driver, GPU memory, torch, CUDA, date and start in UTC, git commit, the command) are appended to
``--out``/gpu.jsonl, the parts' logs kept in ``--out``/logs/INVOCATION/; a table is printed at the end. When an
outer limit stops the tool (SIGTERM, as ``timeout`` sends), the rows of the parts that ran to their end are still
written (exit 130). Exit 1 when a part failed (its row says why), 2 when the machine lacks something.

What the parts took on one H100 80GB (2026-11-27, docs/results/gpu/logs_2026-11-27/): plans 12-16 s together; a
compiled 1.2B training run of 14 steps 37-45 s at micro-batch 2, 30-33 s at 4, 29-35 s (12 steps) at 8; the
profiled run 35 s at micro-batch 2, 28 s at 8; the 3.5B run 19 s; decode of the whole 1.2B (40 layers, one
layout) 111 s. ``--steps 14 --profile --big --decode-layers 40 --decode-layouts standard`` took 324 s in all,
machine start not counted; each layout at one more micro-batch adds ~35 s.

``--tiny`` runs every part on the CPU with the 2-layer ``tiny`` preset (seq 64, global batch 4, byte tokenizer,
eager; the data: ``--tokens``, else ../shared/data/fineweb's text, else the Python standard library), the parts
three at a time: ~75 s of CPU time (each part is ~9 s of one core, mostly imports), ~40 s on two idle cores. The
CPU's "peak memory" is the process's peak resident set, so the plan's error is not reported there, and its trace
has no GPU events (busy share None, with a note).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import peers
from ladder_train.bench.environment import invocation_id
from ladder_train.train.trace_summary import summarize_trace

REPO = Path(__file__).resolve().parents[1]
GPU_DIR = REPO / ".gpu"
SHARED = Path(os.environ.get("LADDER_SHARED", REPO.parent / "shared"))
LAYOUTS = ("standard", "parallel", "ladder")
# what the parts import that a bare GPU machine may lack (.gpu/whl has the pure-Python ones)
NEEDED_MODULES = ("torch", "omegaconf", "datasets", "torchdata", "tokenizers", "pyarrow", "numpy", "yaml")
POLL_S = 0.5
STOP = threading.Event()  # set on Ctrl-C / SIGTERM: every running part kills its process group


# --- what a mode runs ---------------------------------------------------------------------------------------------


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
class Part:
    """One subprocess: ``done`` says its work is in (it is then stopped rather than waited for)."""

    name: str
    kind: str
    argv: list[str]
    limit_s: float
    log: Path
    done: object = None  # () -> bool
    info: dict = field(default_factory=dict)
    outcome: dict = field(default_factory=dict)


# --- running parts ------------------------------------------------------------------------------------------------


def kill_group(proc: subprocess.Popen, gentle: bool) -> None:
    """Every process of the part's group: SIGTERM first when ``gentle`` (a time limit), then SIGKILL."""
    if gentle and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_part(part: Part, env: dict) -> dict:
    """Runs ``part`` to its end, its ``done`` or its limit; its outcome (rc, timed_out, stopped, wall_s)."""
    if STOP.is_set():
        part.outcome = {"rc": None, "timed_out": False, "stopped": False, "interrupted": True, "wall_s": 0.0}
        return part.outcome
    start = time.monotonic()
    rc, timed_out, stopped = None, False, False
    with open(part.log, "w") as log:
        log.write("$ " + shlex.join(part.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            part.argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while rc is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(timeout=POLL_S)
                break
            if STOP.is_set():
                break
            if part.done is not None and part.done():
                stopped = True
                break
            if time.monotonic() - start > part.limit_s:
                timed_out = True
                break
    finally:
        kill_group(proc, gentle=timed_out or STOP.is_set())
    part.outcome = {
        "rc": rc,
        "timed_out": timed_out,
        "stopped": stopped,
        "interrupted": rc is None and not (timed_out or stopped),
        "wall_s": round(time.monotonic() - start, 1),
    }
    print(f"  {part.name}: {describe_outcome(part.outcome)} ({part.outcome['wall_s']:.0f} s)", flush=True)
    return part.outcome


def describe_outcome(outcome: dict) -> str:
    if outcome.get("stopped"):
        return "done (stopped after its last step)"
    if outcome.get("timed_out"):
        return "TIMED OUT"
    if outcome.get("interrupted"):
        return "interrupted"
    return "done" if outcome.get("rc") == 0 else f"FAILED (exit {outcome.get('rc')})"


def part_ok(part: Part) -> bool:
    return part.outcome.get("rc") == 0 or bool(part.outcome.get("stopped"))


def run_parts(parts: list[Part], env: dict, jobs: int, start_by: float | None = None) -> None:
    """``jobs`` parts at once; with ``start_by`` (a time.monotonic() deadline) a part not started by then is not
    started (its outcome says ``not_started``)."""
    if not parts:
        return

    def start(part: Part) -> None:
        if start_by is not None and time.monotonic() > start_by:
            part.outcome = {"rc": None, "not_started": True, "wall_s": 0.0}
        else:
            run_part(part, env)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(start, part) for part in parts]
        try:
            for future in futures:
                future.result()
        except BaseException:
            STOP.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def failure(part: Part) -> str | None:
    """Why a part failed: its outcome and the log's last error line (or last line)."""
    if part_ok(part):
        return None
    lines = [x for x in part.log.read_text(errors="replace").splitlines() if x.strip()] if part.log.exists() else []
    errors = [x for x in lines if re.search(r"Error|error:|Killed|Traceback", x)]
    last = (errors or lines or [""])[-1].strip()
    return f"{describe_outcome(part.outcome)}: {last[:300]}"


# --- reading what the parts wrote ---------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    """The complete JSON lines of ``path`` (a line being written is left out); [] when there is no file."""
    rows = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows


def logged_steps(metrics: Path) -> list[dict]:
    return [r for r in read_jsonl(metrics) if "tokens_per_s" in r and "step" in r]


def reached_step(metrics: Path, step: int):
    return lambda: any(r["step"] >= step for r in logged_steps(metrics))


def throughput(rows: list[dict], skip: int) -> dict:
    """Tokens/s median and range, MFU median over the logged steps after ``skip``; the peak memory of all."""
    if not rows:
        return {"steps": 0}
    measured = [r for r in rows if r["step"] > skip] or rows[-1:]
    tps = [r["tokens_per_s"] for r in measured]
    mfu = [r["mfu"] for r in measured if r.get("mfu") is not None]
    return {
        "steps": max(r["step"] for r in rows),
        "measured_steps": [measured[0]["step"], measured[-1]["step"]],
        "tokens_per_s_median": statistics.median(tps),
        "tokens_per_s_min": min(tps),
        "tokens_per_s_max": max(tps),
        "step_time_s_median": statistics.median(r["step_time_s"] for r in measured),
        "mfu_median": statistics.median(mfu) if mfu else None,
        "peak_mem_gib": max(r["peak_mem_gib"] for r in rows),
    }


def plan_totals(log_text: str) -> dict[str, float]:
    """The totals (GiB) of the ``--dry-run --json`` line in a plan's log: ``sharded`` and ``unsharded`` accumulation;
    {} when it printed none (its log then says why)."""
    for line in reversed(log_text.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError, KeyError, TypeError):
                memory = json.loads(line)["memory_gib"]
                return {mode: memory[mode] for mode in ("sharded", "unsharded")}
    return {}


def accumulation_of(log_text: str) -> str | None:
    """The trainer's "FSDP gradients: unsharded|sharded" line; None when the model is not sharded (one CPU process)."""
    match = re.search(r"^FSDP gradients: (unsharded|sharded)\b", log_text, re.M)
    return match.group(1) if match else None


def plan_against(plan: dict[str, float], accumulation: str | None, peak_gib: float | None, on_gpu: bool) -> dict:
    total = plan.get(accumulation or "sharded")
    row = {"plan": plan, "plan_accumulation": accumulation, "plan_total_gib": total, "plan_rel_error": None}
    if total is None:
        row["plan_note"] = "no total in the dry run's output"
    elif not on_gpu:
        row["plan_note"] = "on the CPU peak memory is the process's peak resident set, not the plan's GPU memory"
    elif peak_gib:
        row["plan_rel_error"] = (total - peak_gib) / peak_gib
    return row


def decode_row(bench: dict) -> dict:
    """A ladder-bench row: TPOT and the weights' read bandwidth, parameters x bytes per parameter / TPOT."""
    from ladder_train.model import ModelArgs, count_params

    args = ModelArgs(**bench["model_args"])
    params = count_params(args)["total"]
    weight_bytes = params * {"bfloat16": 2, "float16": 2, "float32": 4}.get(bench.get("dtype"), 2)
    tpot_ms = bench["decode_ms_per_token"]
    return {
        "kind": "decode",
        "layout": bench["layout"],
        "model": bench["model"],
        "n_layers": args.n_layers,
        "batch": bench["batch"],
        "compiled": bench.get("compiled"),
        "gemv_tuning": bench.get("gemv_tuning"),
        "dtype": bench.get("dtype"),
        "prompt_len": bench.get("prompt_len"),
        "gen_len": bench.get("gen_len"),
        "tpot_ms": tpot_ms,
        "tpot_sd_ms": bench.get("tpot_ms", {}).get("sd"),
        "prefill_ms": bench.get("prefill_ms"),
        "tokens_per_s": bench.get("tokens_per_s"),
        "params": params,
        "weight_bytes": weight_bytes,
        "bandwidth_gb_s": weight_bytes / (tpot_ms / 1e3) / 1e9,
        "bench_weight_bytes": bench.get("weight_bytes_per_rank"),
        "compilations": bench.get("compilations"),
        "device": bench.get("device"),
    }


# --- the machine --------------------------------------------------------------------------------------------------


def install_wheels(wheels: list[Path], site: Path) -> None:
    """The wheels into ``site`` by pip, offline (``--no-index``), without their dependencies (gpu_prepare.sh fetched
    each one a bare machine lacks)."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: pip could not install {site.parent.name}/whl: {done.stderr.strip()[-300:]}")


def ensure_imports(gpu_dir: Path = GPU_DIR) -> Path | None:
    """What the parts import, from ``gpu_dir``/whl (installed into ``gpu_dir``/site) when the machine lacks it; the
    site folder the children need on their path, or None."""
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    wheels = sorted((gpu_dir / "whl").glob("*.whl"))
    site = gpu_dir / "site"
    if wheels:
        install_wheels(wheels, site)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    still = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if still:
        raise SystemExit(
            f"gpu_check: cannot import {', '.join(still)}: run `bash benchmarks/gpu_prepare.sh` on the development "
            f"machine and bring {gpu_dir.name}/ (its whl/) along"
        )
    return site


def child_env(site: Path | None, tiny: bool) -> dict:
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(site)] if site else []) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if tiny:  # the CPU: every part in one thread, several parts at once
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run([exe, *query], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    if done.returncode != 0 or not lines:
        return {}
    name, driver, memory = (x.strip() for x in (lines[0].split(",") + ["", ""])[:3])
    return {
        "card": name,
        "driver": driver,
        "gpu_memory_mib": int(float(memory)) if memory else None,
        "gpus": len(lines),
    }


COMMIT_FILE = GPU_DIR / "commit"  # gpu_prepare.sh: the checkout's commit, for a copy of it that is no git checkout


def project_commit() -> tuple[str | None, bool | None]:
    """The project's commit and whether tracked files differ from it: git's when REPO is the top of a git checkout,
    else what gpu_prepare.sh recorded in .gpu/commit (a copied tree inside another repository must not report that
    repository's commit)."""
    top = git("rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == REPO:
        status = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD"), None if status is None else bool(status)
    try:
        commit, dirty = COMMIT_FILE.read_text().split()[:2]
    except (OSError, ValueError):
        return None, None
    return commit, dirty == "dirty"


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(argv: list[str], started: datetime.datetime, tiny: bool, module: str = "benchmarks.gpu_check") -> dict:
    """The library's environment record of this invocation (its id, command, dates, host) with the card, driver,
    torch, CUDA and commit (after the parts ran: asking torch for the card makes a CUDA context)."""
    import torch

    from ladder_train.bench import environment as record

    smi = {} if tiny else nvidia_smi()
    card = smi.get("card") or (torch.cuda.get_device_name(0) if torch.cuda.is_available() and not tiny else None)
    commit, dirty = project_commit()
    return {
        **record.invocation(["python", "-m", module, *argv], started),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "tiny" if tiny else "gpu",
        "device": "cuda" if card else "cpu",
        "card": card,
        "driver": smi.get("driver"),
        "gpu_memory_mib": smi.get("gpu_memory_mib"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_commit": commit,
        "git_dirty": dirty,
        "host": record.host(),
    }


# --- the parts ----------------------------------------------------------------------------------------------------


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
    measured += peers.parts(plan, Part) if args.peers else []
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


def last_override(argv: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` in ``argv`` (the one the config keeps)."""
    values = [x.split("=", 1)[1] for x in argv if x.startswith(key + "=")]
    return values[-1] if values else None


def training_row(part: Part, plan_part: Part | None, mode: Mode, on_gpu: bool) -> dict:
    log_text = part.log.read_text(errors="replace") if part.log.exists() else ""
    figures = throughput(logged_steps(part.info["run_dir"] / "metrics.jsonl"), 1 if part.kind == "big" else mode.skip)
    row = {
        "kind": part.kind,
        "layout": part.info["layout"],
        "recipe": part.info["recipe"],
        "micro_batch": part.info["micro_batch"],
        "global_batch": int(last_override(part.argv, "train.global_batch_size")),
        "compiled": last_override(part.argv, "parallel.compile") == "true",
        "variant": part.info.get("variant", []),
        **figures,
    }
    plan_text = plan_part.log.read_text(errors="replace") if plan_part and plan_part.log.exists() else ""
    row.update(plan_against(plan_totals(plan_text), accumulation_of(log_text), row.get("peak_mem_gib"), on_gpu))
    row["error"] = failure(part) or (failure(plan_part) if plan_part else None)
    row.update(part.outcome, command=shlex.join(["python", *part.argv[1:]]), log=part.log.name)
    if plan_part:
        row["plan_command"] = shlex.join(["python", *plan_part.argv[1:]])
    return row


def profile_row(part: Part, mode: Mode, keep_trace: bool) -> dict:
    row = training_row(part, None, mode, on_gpu=False)
    for key in ("plan", "plan_accumulation", "plan_total_gib", "plan_rel_error", "plan_note"):
        row.pop(key, None)
    row["profile"] = part.info["profile"]
    traces = sorted((part.info["run_dir"] / "profile").glob("rank0_steps*.pt.trace.json"))
    if not traces:
        row["error"] = row["error"] or "no trace written (RUN_DIR/profile/rank0_steps*.pt.trace.json)"
        return row
    row["trace"] = traces[-1].name
    row.update(summarize_trace(json.loads(traces[-1].read_text())))
    if keep_trace:
        kept = part.log.with_name(traces[-1].name + ".gz")
        with open(traces[-1], "rb") as src, gzip.open(kept, "wb") as dst:
            shutil.copyfileobj(src, dst)
        row["trace_kept"] = kept.name
    return row


def decode_rows(part: Part) -> list[dict]:
    rows = [decode_row(r) for r in read_jsonl(part.info["out"])] or [{"kind": "decode"}]
    error = failure(part) or (None if "tpot_ms" in rows[0] else "no rows from ladder-bench")
    for row in rows:
        row.update(error=error, command=shlex.join(["python", *part.argv[1:]]), log=part.log.name, **part.outcome)
    return rows


# --- the table ----------------------------------------------------------------------------------------------------


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, spec=",.0f") -> str:
    return "-" if x is None else format(x, spec)


def part_label(row: dict) -> str:
    """train, big, or train+ where a variant's overrides changed the run (they follow its figures)."""
    return row["kind"] + ("+" if row.get("variant") else "")


def table(rows: list[dict], env: dict) -> str:
    head = (
        f"gpu_check ({env['mode']}): {env['card'] or 'CPU: ' + env['host']['cpu_model']} | driver "
        f"{env['driver'] or '-'} | torch {env['torch']} (CUDA {env['cuda'] or '-'}) | {env['date']} | commit "
        f"{(env['git_commit'] or '-')[:10]}{' (dirty)' if env['git_dirty'] else ''}"
    )
    columns = f"{'part':<8} {'layout':<9} {'mb':>3}  {'tokens/s median (range)':<27} {'MFU':>6} "
    columns += f"{'peak GiB':>9} {'plan GiB':>9} {'plan err':>8}"
    lines = [head, columns]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['kind']:<8} {r.get('layout', '-'):<9} {r.get('micro_batch', '-')!s:>3}  {r['error']}")
        elif r["kind"] in ("train", "big"):
            tps = f"{_num(r.get('tokens_per_s_median'))} ({_num(r.get('tokens_per_s_min'))}-{_num(r.get('tokens_per_s_max'))})"
            lines.append(
                f"{part_label(r):<8} {r['layout']:<9} {r['micro_batch']:>3}  {tps:<27} {_pct(r.get('mfu_median')):>6} "
                f"{_num(r.get('peak_mem_gib'), '.2f'):>9} {_num(r['plan_total_gib'], '.2f'):>9} {_pct(r['plan_rel_error']):>8}"
                + (f"  {', '.join(r['variant'])}" if r.get("variant") else "")
            )
        elif r["kind"] == "profile":
            busy = (
                f"GPU busy {_pct(r['busy_share'])} of {r['span_ms']:.1f} ms"
                if r.get("busy_share") is not None
                else r.get("note", "")
            )
            per = f"per step: {_num(r['kernels_per_step'])} kernels, {_num(r['copies_per_step'])} copies, "
            per += f"{_num(r['memsets_per_step'])} memsets, {_num(r['runtime_calls_per_step'])} runtime calls"
            host = f"host {_num(r.get('host_step_ms'))} ms a step"
            lines.append(f"profile  {r['layout']:<9} {r['micro_batch']:>3}  {busy}; {host}; {per}")
            lines += [f"{'':<24}{k['ms']:10.2f} ms {k['count']:6d}x  {k['name'][:90]}" for k in r["top_kernels"][:5]]
        elif r["kind"] == "ceilings":
            lines.append(
                f"ceilings copy {r['copy_tb_s_median'] * 1e3:,.0f} GB/s (read + written), bf16 matmul "
                f"{r['matmul']['n']}^3 {r['matmul_tflops_median']:,.1f} TFLOP/s"
            )
        elif r["kind"] == "decode":
            tuned = {True: ", GEMV tuned", False: ", GEMV untuned"}.get(r.get("gemv_tuning"), "")
            lines.append(
                f"decode   {r['layout']:<9} {r['batch']:>3}  TPOT {r['tpot_ms']:.3f} ms ({r['n_layers']} layers{tuned}, "
                f"{r['weight_bytes'] / 1e6:,.1f} MB of weights): {r['bandwidth_gb_s']:,.1f} GB/s"
            )
        elif r["kind"] in peers.KINDS:
            lines.append(peers.table_line(r))
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------------------------------------


def names_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in LAYOUTS]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"layouts from {', '.join(LAYOUTS)}, comma-separated (got {text!r})")
    return items


def variant_overrides(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or any("=" not in x or not x.split("=", 1)[0] for x in items):
        raise argparse.ArgumentTypeError(f"KEY=VALUE[,KEY=VALUE...], got {text!r}")
    return items


def tunings_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or set(items) - {"on", "off"} or len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"on, off or on,off (got {text!r})")
    return items


def ints_list(text: str) -> list[int]:
    try:
        items = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        items = []
    if not items or min(items) < 1:
        raise argparse.ArgumentTypeError(f"positive integers, comma-separated (got {text!r})")
    return items


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of gpu.jsonl (appended) and logs/")
    p.add_argument("--layouts", type=names_list, default=list(LAYOUTS), help="default standard,parallel,ladder")
    p.add_argument("--micro", type=ints_list, default=[2], help="micro-batch sizes, comma-separated (default 2)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 20; --tiny 4)")
    p.add_argument("--skip", type=int, default=None, help="first steps left out of the medians (default 5; --tiny 1)")
    p.add_argument("--profile", action="store_true", help="one profiled run of the first layout and micro-batch")
    p.add_argument(
        "--decode-layers", type=int, default=None, help="layers of the decode slice (default 8; --tiny 2; 0: no decode)"
    )
    p.add_argument(
        "--decode-layouts", type=names_list, default=None, help="layouts of the decode part (default --layouts)"
    )
    p.add_argument(
        "--gemv-tuning",
        type=tunings_list,
        default=None,
        help="decode with ladder-bench's --gemv-tuning on, off or both side by side (default on,off; --tiny on)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        type=variant_overrides,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="each training run again with these overrides, right after it (repeatable: one run per variant)",
    )
    p.add_argument("--big", action="store_true", help="the 3.5B ladder's peak memory at micro-batch 1")
    p.add_argument("--peers", action="store_true", help="torchtitan, transformers and a bare loop beside our rows")
    p.add_argument("--tiny", action="store_true", help="every part on the CPU with a tiny model (a check of this tool)")
    p.add_argument("--tokens", default=None, help="the token folder (default .gpu/tokens; --tiny: FineWeb text)")
    p.add_argument("--tokenizer", default=None, help="its tokenizer (default .gpu/tokenizer.json; --tiny: byte)")
    p.add_argument("--keep-trace", action="store_true", help="keep the profiled run's trace (gzipped) beside the logs")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        type=config_override,
        metavar="KEY=VALUE",
        help="a config override of every training run and plan (repeatable), e.g. parallel.accumulate=sharded",
    )
    args = p.parse_args(argv)
    mode = TINY if args.tiny else GPU
    args.steps = args.steps or (4 if args.tiny else 20)
    args.skip = mode.skip if args.skip is None else args.skip
    args.decode_layers = (2 if args.tiny else 8) if args.decode_layers is None else args.decode_layers
    args.gemv_tuning = args.gemv_tuning or (["on"] if args.tiny else ["on", "off"])  # a CPU has no GEMV tuning
    if args.skip >= args.steps:
        p.error(f"--skip {args.skip} leaves no step of --steps {args.steps} to measure")
    if any(mode.global_batch % m for m in args.micro):
        p.error(f"every --micro must divide the global batch of {mode.global_batch} sequences")
    return args


def config_override(text: str) -> str:
    if "=" not in text or not text.split("=", 1)[0]:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


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
        raise SystemExit(
            f"gpu_check: no token folder at {tokens} or no tokenizer at {tokenizer}: run `bash "
            "benchmarks/gpu_prepare.sh` on the development machine and bring .gpu/ along"
        )
    return [f"data.source={tokens.resolve()}", f"data.tokenizer={tokenizer.resolve()}"]


def refused_setting(plan: Plan) -> str | None:
    """The first training run whose config the trainer would refuse (a ``--variant`` or ``--set`` key or value), as
    its one line, or None: checked here by ladder_train.config before any part runs, not as FAILED rows later."""
    from ladder_train.config import load_config
    from ladder_train.errors import ConfigError

    for part in build_parts(plan)[1]:
        if part.argv[1:3] == ["-m", "ladder_train.train"]:
            try:
                load_config(REPO / part.argv[4], part.argv[5:])
            except ConfigError as err:
                return str(err)
    return None


def work_folder(tiny: bool) -> Path:
    """Run folders: /dev/shm when it has room (a stopped 1.2B run may have begun its save), else the temp dir."""
    shm = Path("/dev/shm")
    usable = not tiny and shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 32 * 2**30
    return Path(tempfile.mkdtemp(prefix="gpu_check_", dir=shm if usable else None))


def collect(plan: Plan, measured: list[Part], plans: dict[str, Part], on_gpu: bool) -> list[dict]:
    rows = []
    for part in measured:
        if part.kind in ("train", "big"):
            rows.append(training_row(part, plans.get(part.name), plan.mode, on_gpu))
        elif part.kind == "profile":
            rows.append(profile_row(part, plan.mode, plan.args.keep_trace))
        elif part.kind == "ceilings":
            found = read_jsonl(part.info["out"]) or [{"kind": "ceilings"}]
            error = failure(part) or (None if "copy_tb_s_median" in found[0] else "no row from gpu_ceilings")
            rows.append({**found[0], "error": error, "command": shlex.join(["python", *part.argv[1:]]), **part.outcome})
        elif part.kind in peers.KINDS:
            rows += peers.rows(part, failure(part))
        else:
            rows += decode_rows(part)
    peers.add_ratios(rows)
    return rows


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    site = ensure_imports()
    mode = TINY if args.tiny else GPU
    if not args.tiny:
        import torch  # no CUDA context: is_available asks the driver only

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA device here; --tiny runs the same parts on the CPU")
    data = data_overrides(args)
    refused = refused_setting(Plan(mode, Path("work"), Path("logs"), data, args))
    if refused:
        print(f"gpu_check: error: {refused}", file=sys.stderr)
        return 2
    logs = args.out / "logs" / invocation_id(started)
    logs.mkdir(parents=True, exist_ok=True)
    work = work_folder(args.tiny)
    plan = Plan(mode, work, logs, data, args)
    plan_parts, measured, plans = build_parts(plan)
    env = child_env(site, args.tiny)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(
            f"gpu_check ({mode.name}): {len(plan_parts)} plans, then {len(measured)} parts; logs in {logs}", flush=True
        )
        if mode.jobs > 1:
            run_parts(plan_parts + measured, env, mode.jobs)
        else:
            run_parts(plan_parts, env, min(8, os.cpu_count() or 1))
            run_parts(measured, env, 1)
        rows = collect(plan, measured, plans, on_gpu=not args.tiny)
    except KeyboardInterrupt:
        # an outer time limit (SIGTERM) keeps what finished: the rows of the parts that ran to their end
        finished = [p for p in measured if p.outcome and not p.outcome.get("interrupted")]
        rows = collect(plan, finished, plans, on_gpu=not args.tiny)
        names = ", ".join(p.name for p in measured if p not in finished) or "none"
        print(f"gpu_check: interrupted; every part's processes stopped; not run to its end: {names}", flush=True)
        if rows:
            finish(rows, argv, started, args)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(work, ignore_errors=True)
    return finish(rows, argv, started, args)


def finish(rows: list[dict], argv: list[str], started: datetime.datetime, args: argparse.Namespace) -> int:
    from benchmarks.records import append_rows

    env = environment(argv, started, args.tiny)
    for row in rows:
        row["env"] = env
    append_rows(args.out / "gpu.jsonl", rows)
    print(table(rows, env))
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
