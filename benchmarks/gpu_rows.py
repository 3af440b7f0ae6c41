"""gpu_check's rows, from what its parts wrote: the trainer's metrics.jsonl (tokens/s, MFU, peak memory), the plan's
``--dry-run --json`` line, the profiled run's trace (the library's ``summarize_trace``), ladder-bench's and
gpu_ceilings' rows, the peers' (``peers.rows``), the run's summary.json (the FSDP gradient accumulation it chose);
a part that failed gives its row an ``error``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shlex
import shutil
import statistics
from pathlib import Path

from benchmarks import peers
from benchmarks.parts import Part, failure
from benchmarks.records import read_jsonl


def collect(measured: list[Part], plans: dict[str, Part], skip: int, on_gpu: bool, keep_trace: bool) -> list[dict]:
    """The rows of the ``measured`` parts in their order (``plans``: the plan part of each training part by name;
    ``skip``: the steps left out of the medians), with the peers' ratios to ours."""
    rows = []
    for part in measured:
        if part.kind in ("train", "big"):
            rows.append(training_row(part, plans.get(part.name), skip, on_gpu))
        elif part.kind == "profile":
            rows.append(profile_row(part, skip, keep_trace))
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


def training_row(part: Part, plan_part: Part | None, skip: int, on_gpu: bool) -> dict:
    figures = throughput(logged_steps(part.info["run_dir"] / "metrics.jsonl"), 1 if part.kind == "big" else skip)
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
    row.update(
        plan_against(plan_totals(plan_text), accumulation_of(part.info["run_dir"]), row.get("peak_mem_gib"), on_gpu)
    )
    row["error"] = failure(part) or (failure(plan_part) if plan_part else None)
    row.update(part.outcome, command=shlex.join(["python", *part.argv[1:]]), log=part.log.name)
    if plan_part:
        row["plan_command"] = shlex.join(["python", *plan_part.argv[1:]])
    return row


def profile_row(part: Part, skip: int, keep_trace: bool) -> dict:
    row = training_row(part, None, skip, on_gpu=False)
    for key in ("plan", "plan_accumulation", "plan_total_gib", "plan_rel_error", "plan_note"):
        row.pop(key, None)
    row["profile"] = part.info["profile"]
    traces = sorted((part.info["run_dir"] / "profile").glob("rank0_steps*.pt.trace.json"))
    if not traces:
        row["error"] = row["error"] or "no trace written (RUN_DIR/profile/rank0_steps*.pt.trace.json)"
        return row
    from ladder_train.files import open_to_write
    from ladder_train.train.trace_summary import summarize_trace

    row["trace"] = traces[-1].name
    row.update(summarize_trace(json.loads(traces[-1].read_text())))
    if keep_trace:
        kept = part.log.with_name(traces[-1].name + ".gz")
        with (
            open(traces[-1], "rb") as src,
            open_to_write(kept, "wb") as out,  # never through a link planted in the logs folder
            gzip.GzipFile(filename=traces[-1].name, mode="wb", fileobj=out) as dst,
        ):
            shutil.copyfileobj(src, dst)
        row["trace_kept"] = kept.name
    return row


def decode_rows(part: Part) -> list[dict]:
    rows = [decode_row(r) for r in read_jsonl(part.info["out"])] or [{"kind": "decode"}]
    error = failure(part) or (None if "tpot_ms" in rows[0] else "no rows from ladder-bench")
    for row in rows:
        row.update(error=error, command=shlex.join(["python", *part.argv[1:]]), log=part.log.name, **part.outcome)
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


def accumulation_of(run_dir: Path) -> str | None:
    """The FSDP gradient accumulation the run chose (its summary.json, written as it starts): unsharded or sharded;
    None when the model is not sharded (one CPU process) or the run wrote no summary."""
    from ladder_train.folders import read_optional_json  # the package: after ensure_imports

    summary = read_optional_json(run_dir / "summary.json")
    accumulate = summary.get("fsdp_gradients")
    return accumulate if accumulate in ("unsharded", "sharded") else None


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


def last_override(argv: list[str], key: str) -> str | None:
    """The value of the last ``key=value`` in ``argv`` (the one the config keeps)."""
    values = [x.split("=", 1)[1] for x in argv if x.startswith(key + "=")]
    return values[-1] if values else None
