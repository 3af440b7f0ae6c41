"""The project on one GPU in one command, on a bare, offline machine (issue 40): training tokens/s, MFU and peak
memory per layout and micro-batch against the ``--dry-run`` plan, a profiled step summarised, compiled decode.

    bash benchmarks/gpu_prepare.sh        # on the development machine, from the root: .gpu/ (tokens, tokenizer, wheels)
    python -m benchmarks.gpu_check --out docs/results/gpu [--layouts standard,parallel,ladder] [--micro 2,4]
        [--steps 20] [--profile] [--decode-layers 8] [--big] [--keep-trace] [--variant KEY=VALUE[,KEY=VALUE] ...]
        [--set KEY=VALUE ...]
    python -m benchmarks.gpu_check --tiny --out /tmp/gpu-tiny    # the same parts on the CPU with a tiny model

Each part is a subprocess in its own process group with a time limit (``benchmarks/parts.py``); the group is killed
when the part ends, stops early or runs out of time, so no process outlives it (Ctrl-C / SIGTERM stop the running
parts the same way). Run folders live in a temporary folder (in /dev/shm when it has room) removed at the end. Before
any part runs, every training run's config (its recipe with ``--set`` and its ``--variant``) is loaded as the trainer
would load it and the decode part's command checked as ladder-bench checks it: a key or value they would refuse, a
flag out of its range or an ``--out``, ``--tokens`` or ``--tokenizer`` that is not there is one line, ``gpu_check:
error: ...``, exit 2, nothing run.
Where the rest lives: what runs in which order, ``gpu_plan.py``; the machine (wheels, environment, commit),
``machine.py``; the rows, ``gpu_rows.py``, on the library's trace summary (``ladder_train/train/trace_summary.py``),
``ladder-train --dry-run --json`` and environment record (``ladder_train/bench/environment.py``); the table,
``gpu_table.py``.

In this order:
- plans: ``ladder-train ... --dry-run --simulate 1x1 --json`` of every training run; its memory totals (GiB) with
  sharded and with unsharded gradient accumulation. CPU only: they run together before anything is measured.
- ceilings: ``benchmarks/gpu_ceilings.py``, the card's device-to-device copy rate and bf16 matrix-product rate
  (decode's bandwidth and MFU are read against them).
- training: per layout and micro-batch, ``recipes/{layout}_1b.yaml`` (the 1.2B preset, seq 2048) on the token folder,
  global batch 16, compiled, ``--steps`` steps logged every step. Row: tokens/s median and range and MFU median
  over the steps after the first ``--skip`` (compilation), peak memory, and the plan's total for the accumulation
  the run used (its summary.json) with the plan's relative error (plan - peak) / peak. A run is stopped
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
import datetime
import os
import shutil
import sys
from pathlib import Path

from benchmarks.gpu_plan import GPU, LAYOUTS, TINY, Plan, Refused, build_parts, data_overrides
from benchmarks.gpu_rows import collect
from benchmarks.gpu_table import table
from benchmarks.machine import child_env, ensure_imports, environment, work_folder
from benchmarks.parts import REPO, run_parts, sigterm_interrupts
from benchmarks.records import append_rows, config_override


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


def counted(low: int):
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"an integer >= {low} (got {text!r})")
        return value

    return parse


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are Refused: one line, ``gpu_check: error: ...``, like every other bad input."""

    def error(self, message: str):
        raise Refused(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of gpu.jsonl (appended) and logs/")
    p.add_argument("--layouts", type=names_list, default=list(LAYOUTS), help="default standard,parallel,ladder")
    p.add_argument("--micro", type=ints_list, default=[2], help="micro-batch sizes, comma-separated (default 2)")
    p.add_argument("--steps", type=counted(1), default=None, help="training steps per run (default 20; --tiny 4)")
    p.add_argument(
        "--skip", type=counted(0), default=None, help="first steps left out of the medians (default 5; --tiny 1)"
    )
    p.add_argument("--profile", action="store_true", help="one profiled run of the first layout and micro-batch")
    p.add_argument(
        "--decode-layers",
        type=counted(0),
        default=None,
        help="layers of the decode slice (default 8; --tiny 2; 0: no decode)",
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
    return with_defaults(p.parse_args(argv))


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with each unset option the mode's default, checked together; a path named that is not what it must
    be is Refused (``--tokens`` / ``--tokenizer`` of a GPU run: ``data_overrides``, which knows the defaults)."""
    mode = TINY if args.tiny else GPU
    args.steps = (4 if args.tiny else 20) if args.steps is None else args.steps
    args.skip = mode.skip if args.skip is None else args.skip
    args.decode_layers = (2 if args.tiny else 8) if args.decode_layers is None else args.decode_layers
    args.gemv_tuning = args.gemv_tuning or (["on"] if args.tiny else ["on", "off"])  # a CPU has no GEMV tuning
    if args.skip >= args.steps:
        raise Refused(f"--skip {args.skip} leaves no step of --steps {args.steps} to measure")
    if any(mode.global_batch % m for m in args.micro):
        raise Refused(f"every --micro must divide the global batch of {mode.global_batch} sequences")
    blocked = [p for p in (args.out, *args.out.parents) if p.exists() and not p.is_dir()]
    if blocked:
        raise Refused(f"--out {args.out}: {blocked[0]} is not a folder (gpu.jsonl and logs/ go into a folder)")
    if args.tiny and args.tokens and args.tokens != "python-stdlib" and not Path(args.tokens).exists():
        raise Refused(f"--tokens {args.tokens}: no such file or folder (a token folder or a text source)")
    if args.tiny and args.tokenizer not in (None, "byte") and not Path(args.tokenizer).is_file():
        raise Refused(f"--tokenizer {args.tokenizer}: no such file (a tokenizer.json, or byte)")
    return args


def refused_setting(plan: Plan) -> str | None:
    """The first training run whose config the trainer would refuse (a ``--variant`` or ``--set`` key or value), or
    decode part ladder-bench would refuse (``--decode-layers``), as its one line, or None: checked here by
    ladder_train.config and ladder-bench's own check before any part runs, not as FAILED rows later."""
    from ladder_train.bench.options import measurements
    from ladder_train.cli.bench import FLAGS, parse_args
    from ladder_train.config import load_config
    from ladder_train.errors import InputError
    from ladder_train.option_errors import OptionError

    for part in build_parts(plan)[1]:
        try:
            if part.argv[1:3] == ["-m", "ladder_train.train"]:
                load_config(REPO / part.argv[4], part.argv[5:])
            elif part.argv[1:3] == ["-m", "ladder_train.bench"]:
                measurements(parse_args(part.argv[3:]), tp=1)
        except (InputError, OptionError) as err:
            message = err.naming(FLAGS) if isinstance(err, OptionError) else str(err)
            if part.kind != "decode":
                return message
            return f"--decode-layers {plan.args.decode_layers}: ladder-bench refuses the decode part: {message}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    started = datetime.datetime.now(datetime.UTC)
    try:
        args = parse_args(argv)
        site = ensure_imports()
        if not args.tiny:
            import torch  # no CUDA context: is_available asks the driver only

            if not torch.cuda.is_available():
                raise Refused("no CUDA device here; --tiny runs the same parts on the CPU")
        data = data_overrides(args)
        refused = refused_setting(Plan(TINY if args.tiny else GPU, Path("work"), Path("logs"), data, args))
        if refused:
            raise Refused(refused)
    except Refused as err:
        print(f"gpu_check: error: {err}", file=sys.stderr)
        return 2
    mode = TINY if args.tiny else GPU
    from ladder_train.bench.environment import invocation_id  # the package: after ensure_imports
    from ladder_train.files import make_folder

    logs = make_folder(make_folder(args.out / "logs") / invocation_id(started))  # neither through a link
    work = work_folder(args.tiny)
    plan = Plan(mode, work, logs, data, args)
    plan_parts, measured, plans = build_parts(plan)
    env = child_env(site, args.tiny)
    with sigterm_interrupts():
        try:
            print(
                f"gpu_check ({mode.name}): {len(plan_parts)} plans, then {len(measured)} parts; logs in {logs}",
                flush=True,
            )
            if mode.jobs > 1:
                run_parts(plan_parts + measured, env, mode.jobs)
            else:
                run_parts(plan_parts, env, min(8, os.cpu_count() or 1))
                run_parts(measured, env, 1)
            rows = collect(measured, plans, args.skip, on_gpu=not args.tiny, keep_trace=args.keep_trace)
        except KeyboardInterrupt:
            # an outer time limit (SIGTERM) keeps what finished: the rows of the parts that ran to their end
            finished = [p for p in measured if p.outcome and not p.outcome.get("interrupted")]
            rows = collect(finished, plans, args.skip, on_gpu=not args.tiny, keep_trace=args.keep_trace)
            names = ", ".join(p.name for p in measured if p not in finished) or "none"
            print(f"gpu_check: interrupted; every part's processes stopped; not run to its end: {names}", flush=True)
            if rows:
                finish(rows, argv, started, args)
            return 130
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return finish(rows, argv, started, args)


def finish(rows: list[dict], argv: list[str], started: datetime.datetime, args: argparse.Namespace) -> int:
    env = environment(argv, started, args.tiny)
    for row in rows:
        row["env"] = env
    append_rows(args.out / "gpu.jsonl", rows)
    print(table(rows, env))
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
