"""Peers beside the project on the same card, in the same gpu_check invocation (issue 62): the recipe's 1.2B shape
trained by torchtitan's Llama trainer, decoded by transformers' LlamaForCausalLM, and our model trained by a bare
loop. ``python -m benchmarks.gpu_check --out DIR --peers`` runs them as parts after its training parts (each a
process of ``benchmarks/peer_runs.py``); this module builds their commands, reads what they wrote into rows and pairs
those with our rows of the same invocation.

- peer_train (per ``--micro``): torchtitan 0.2.2, the newest release whose imports torch 2.11 (the H200's) has
  (0.3.0 imports ``DataParallelMeshDims`` from torch.distributed.fsdp, which 2.11 lacks), through its own entry point
  (``torchtitan.train.main`` and ``Trainer``) on its Llama's train spec with the recipe's shape as one more flavour
  (``peer_runs.titan_model``: dim, layers, heads, vocabulary, norm eps, its ``multiple_of`` rule giving our SwiGLU
  width, its Llama-3.1 RoPE scaling at factor 1, i.e. plain RoPE) and synthetic tokens. Its Llama has no tied head:
  + vocab x dim parameters (75.5M at 1.2B), the same FLOPs per token. The recipe's micro-batch, global batch,
  sequence, steps, AdamW, bf16, compile (each block and the loss) and activation checkpointing
  (``peer_runs.titan_flags``). On one GPU torchtitan shards nothing (FSDP only where dp_shard > 1) and trains under
  autocast bf16; the row's ``precision`` says which its log reported. Row: tokens/s of its log lines (median over the
  steps after ``--skip``), MFU by our formula (``model.flops_per_token``, the card's peak from ``gpu_cards``), its own
  MFU beside, and ours / theirs against the train row of the standard layout at that micro-batch.
- bare_loop (per ``--micro``): our model wrapped by ``parallelize`` (compile, FSDP2, the micro-batch plan) as the
  trainer builds it, trained by forward, backward, clip and AdamW on batches held in device memory: no loader,
  metrics, stability guard or checkpointer. Row: tokens/s, MFU, and trainer / bare (the trainer's own cost).
- peer_decode: our preset's model (random weights, ``--decode-layers`` layers) saved as ladder-export saves a
  standard model (``save_export``, bf16), loaded by transformers' LlamaForCausalLM and generated from the way
  transformers documents fast generation: a static cache (``cache_implementation="static"``), with which generate
  compiles its decode step by itself; batch 1, greedy, no stop token, the decode part's prompt and new tokens. TPOT =
  (median generate of N new tokens - median generate of 1) / (N - 1), every call on the cache sized for N
  (``max_cache_len``): one compilation. Row: TPOT, and ours / theirs against our fastest decode row of the standard
  layout, the same layers, prompt and new tokens (below 1: ours is faster).

``--tiny`` runs the bare loop and an eager decode of the tiny preset on the CPU; torchtitan needs CUDA there and is
left out. The peers' wheels a bare GPU machine lacks come from ``gpu_prepare.sh`` (torchtitan, tyro, docstring-parser,
typeguard); the package never imports them.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import sys

from benchmarks.parts import Part

KINDS = ("peer_train", "bare_loop", "peer_decode")
LIMITS = {  # seconds per part, by gpu_check's mode
    "gpu": {"peer_train": 300, "bare_loop": 300, "peer_decode": 420},
    "tiny": {"peer_train": 120, "bare_loop": 120, "peer_decode": 180},
}
PEER_RECIPE = "recipes/standard_1b.yaml"  # torchtitan's Llama and transformers' compute the standard layout
RUNS = [sys.executable, "-m", "benchmarks.peer_runs"]
SETUP = "peers setup: "  # the line peer_runs' titan prints before torchtitan starts, then JSON
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# torchtitan 0.2.2's step line (components/metrics.py, MetricsProcessor.log), its colours stripped
TITAN_STEP = re.compile(
    r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>\S+)\s+grad_norm:\s*(?P<grad_norm>\S+)\s+memory:\s*"
    r"(?P<memory_gib>-?[\d.]+)GiB\((?P<memory_pct>-?[\d.]+)%\)\s+tps:\s*(?P<tps>[\d,]+)\s+tflops:\s*"
    r"(?P<tflops>[\d,.]+)\s+mfu:\s*(?P<mfu>[\d.]+)%"
)
TITAN_VERSION = re.compile(r"torchtitan version: (\S+)")
TITAN_PRECISION = {"Applied FSDP to the model": "FSDP2", "Mixed precision training is handled by AMP": "autocast"}


# --- the parts ----------------------------------------------------------------------------------------------------


DECODE_FLAGS = {  # peer_runs hf-decode's flag: the decode part's (ladder-bench's) flag with its value
    "--preset": "--model",
    "--prompt": "--prompt-len",
    "--new": "--gen-len",
    "--warmup": "--warmup",
    "--runs": "--runs",
}


def _flag(flags, name: str) -> str:
    return flags[list(flags).index(name) + 1]


def parts(plan) -> list[Part]:
    """The peers' parts of one invocation (``plan``: gpu_check's ``gpu_plan.Plan``): per micro-batch
    torchtitan (on a GPU) and the bare loop, on the standard recipe with the training row's overrides, then
    transformers' decode with the decode part's model, layers, prompt, new tokens, runs and compile setting (none
    with ``--decode-layers 0``, as there is no decode part)."""
    args, mode = plan.args, plan.mode
    limits, found = LIMITS[mode.name], []
    for micro in args.micro:
        overrides = plan.train_argv(PEER_RECIPE, micro, args.steps, plan.work / f"peers-mb{micro}")[5:]
        config = ["--config", PEER_RECIPE, *overrides]
        name = f"titan-standard-mb{micro}"
        if mode.name == "gpu":  # torchtitan trains on CUDA only
            argv = [*RUNS, "titan", *config, "--dump", str(plan.work / name)]
            found.append(Part(name, "peer_train", argv, limits["peer_train"], plan.logs / f"{name}.log"))
            found[-1].info["micro_batch"] = micro
        name, out = f"bare-standard-mb{micro}", plan.work / f"bare-standard-mb{micro}.json"
        argv = [*RUNS, "bare", *config, "--out", str(out)]
        found.append(Part(name, "bare_loop", argv, limits["bare_loop"], plan.logs / f"{name}.log"))
        found[-1].info.update(micro_batch=micro, out=out)
    if args.decode_layers:
        found.append(decode_part(plan))
    for part in found:
        part.info.update(skip=args.skip, global_batch=None if part.kind == "peer_decode" else mode.global_batch)
    return found


def decode_part(plan) -> Part:
    decode, out = plan.mode.decode, plan.work / "hf-decode.json"
    argv = [*RUNS, "hf-decode", *(x for flag, theirs in DECODE_FLAGS.items() for x in (flag, _flag(decode, theirs)))]
    argv += ["--layers", str(plan.args.decode_layers)]
    argv += [f"--vocab={x.split('=', 1)[1]}" for x in plan.mode.decode_set if x.startswith("vocab_size=")]
    argv += ["--no-compile"] if _flag(decode, "--compile") == "off" else []
    argv += ["--work", str(plan.work / "hf-decode"), "--out", str(out)]
    part = Part("hf-decode", "peer_decode", argv, LIMITS[plan.mode.name]["peer_decode"], plan.logs / "hf-decode.log")
    part.info.update(micro_batch=None, out=out)
    return part


# --- their output, as rows ----------------------------------------------------------------------------------------


def parse_titan_log(text: str) -> dict:
    """What torchtitan's log (and peer_runs' SETUP line before it) says: each step's figures, the release, whether
    FSDP or autocast did the mixed precision, and the setup (our FLOPs per token, the card's peak, its model args)."""
    text = ANSI.sub("", text)
    steps = [
        {
            "step": int(m["step"]),
            "loss": float(m["loss"]),
            "memory_gib": float(m["memory_gib"]),
            "tokens_per_s": float(m["tps"].replace(",", "")),
            "tflops": float(m["tflops"].replace(",", "")),
            "mfu": float(m["mfu"]) / 100,
        }
        for m in TITAN_STEP.finditer(text)
    ]
    setup = next((json.loads(x[len(SETUP) :]) for x in text.splitlines() if x.startswith(SETUP)), {})
    version = TITAN_VERSION.search(text)
    precision = next((label for line, label in TITAN_PRECISION.items() if line in text), None)
    return {"steps": steps, "setup": setup, "version": version and version[1], "precision": precision}


def throughput(tokens_per_s: list[float], skip: int) -> dict:
    """Median, lowest and highest tokens/s of the steps after the first ``skip`` (steps counted from 1)."""
    measured = tokens_per_s[skip:] or tokens_per_s[-1:]
    if not measured:
        return {"steps": 0, "tokens_per_s_median": None}
    return {
        "steps": len(tokens_per_s),
        "measured_steps": [len(tokens_per_s) - len(measured) + 1, len(tokens_per_s)],
        "tokens_per_s_median": statistics.median(measured),
        "tokens_per_s_min": min(measured),
        "tokens_per_s_max": max(measured),
    }


def mfu(tokens_per_s: float | None, facts: dict) -> float | None:
    """Our MFU: tokens/s x our FLOPs per token / the card's dense bf16 peak (None on a card gpu_cards lacks)."""
    flops, peak = facts.get("flops_per_token"), facts.get("peak_flops")
    return tokens_per_s * flops / peak if tokens_per_s and flops and peak else None


def titan_row(text: str, skip: int) -> dict:
    log = parse_titan_log(text)
    steps, setup = sorted(log["steps"], key=lambda s: s["step"]), log["setup"]
    row = {"peer": "torchtitan", "peer_version": log["version"], "layout": "standard", "precision": log["precision"]}
    row.update(throughput([s["tokens_per_s"] for s in steps], skip))
    measured = steps[skip:] or steps[-1:]
    row["mfu_median"] = mfu(row["tokens_per_s_median"], setup)
    row["peer_mfu_median"] = statistics.median(s["mfu"] for s in measured) if measured else None
    row["peak_reserved_gib"] = max((s["memory_gib"] for s in steps), default=None)
    row.update({key: setup.get(key) for key in ("model_args", "tie_embeddings", "flops_per_token", "device_name")})
    return row | ({} if steps else {"missing": "no step line in torchtitan's log"})


def bare_row(found: dict, skip: int) -> dict:
    times = found.get("step_times_s", [])
    row = {"layout": "standard", **throughput([found["tokens_per_step"] / t for t in times], skip)}
    row["step_time_s_median"] = statistics.median(times[skip:] or times[-1:]) if times else None
    row["mfu_median"] = mfu(row["tokens_per_s_median"], found)
    row.update({key: found.get(key) for key in ("accumulate", "peak_mem_gib", "flops_per_token", "device_name")})
    return row | ({} if times else {"missing": "no step times from the bare loop"})


DECODE_FIELDS = ("peer", "peer_version", "n_layers", "batch", "prompt_len", "gen_len", "tpot_ms", "prefill_ms")
DECODE_FIELDS += ("compiled", "attn_implementation", "generate_ms", "generate_one_ms", "settings", "device_name")


def decode_row(found: dict) -> dict:
    row = {key: found.get(key) for key in DECODE_FIELDS}
    return row | ({} if found.get("tpot_ms") else {"missing": "no TPOT from transformers' decode"})


def rows(part, error: str | None) -> list[dict]:
    """The row of a peers' part; ``error``: gpu_check's account of a part that failed, else what the row lacks."""
    skip = part.info["skip"]
    if part.kind == "peer_train":
        row = titan_row(part.log.read_text(errors="replace") if part.log.exists() else "", skip)
    else:
        out = part.info["out"]
        found = json.loads(out.read_text()) if out.exists() else {}
        row = bare_row(found, skip) if part.kind == "bare_loop" else decode_row(found)
    missing = row.pop("missing", None)
    row = {"kind": part.kind, "micro_batch": part.info["micro_batch"], "global_batch": part.info["global_batch"], **row}
    row.update(error=error or missing, command=shlex.join(["python", *part.argv[1:]]), log=part.log.name)
    return [{**row, **part.outcome}]


def add_ratios(all_rows: list[dict]) -> None:
    """Ours / theirs beside each peer row, from the rows of the same invocation: tokens/s of our train row of the
    standard layout at the same micro-batch (no variant) over torchtitan's, and over the bare loop's (trainer / bare);
    TPOT of our fastest decode row of the standard layout with the same layers, prompt and new tokens over
    transformers'. None where there is no such row."""
    trains = {
        r["micro_batch"]: r
        for r in all_rows
        if r["kind"] == "train" and r.get("layout") == "standard" and not r.get("variant") and not r.get("error")
    }
    for row in all_rows:
        if row["kind"] in ("peer_train", "bare_loop"):
            ours, theirs = trains.get(row["micro_batch"], {}).get("tokens_per_s_median"), row.get("tokens_per_s_median")
            key = "ours_over_theirs" if row["kind"] == "peer_train" else "trainer_over_bare"
            row.update({"ours_tokens_per_s": ours, key: ours / theirs if ours and theirs else None})
        elif row["kind"] == "peer_decode":
            same = ("n_layers", "prompt_len", "gen_len")
            ours = [
                r
                for r in all_rows
                if r["kind"] == "decode"
                and r.get("layout") == "standard"
                and r.get("tpot_ms")
                and not r.get("error")
                and all(r.get(k) == row.get(k) for k in same)
            ]
            best = min(ours, key=lambda r: r["tpot_ms"], default={})
            theirs = row.get("tpot_ms")
            row.update(ours_tpot_ms=best.get("tpot_ms"), ours_gemv_tuning=best.get("gemv_tuning"))
            row["ours_over_theirs"] = best["tpot_ms"] / theirs if best and theirs else None


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def table_line(r: dict) -> str:
    """The row in gpu_check's printed table (a row with an error is printed by gpu_check)."""
    if r["kind"] == "peer_decode":
        how = "compiled" if r.get("compiled") else "eager"
        return (
            f"hf       standard    1  transformers {r['peer_version']}: TPOT {r['tpot_ms']:.3f} ms ({r['n_layers']} "
            f"layers, static cache, {how}); ours {_ratio(r.get('ours_tpot_ms'))} ms, ours / theirs "
            f"{_ratio(r.get('ours_over_theirs'))}"
        )
    tps = f"{r['tokens_per_s_median']:,.0f} ({r['tokens_per_s_min']:,.0f}-{r['tokens_per_s_max']:,.0f})"
    share = "-" if r.get("mfu_median") is None else f"{100 * r['mfu_median']:.1f}%"
    if r["kind"] == "peer_train":
        label = "titan"
        what = f"torchtitan {r['peer_version']} ({r['precision']}); ours / theirs {_ratio(r.get('ours_over_theirs'))}"
    else:
        label, what = "bare", f"bare loop ({r['accumulate']}); trainer / bare {_ratio(r.get('trainer_over_bare'))}"
    return f"{label:<8} {'standard':<9} {r['micro_batch']:>3}  {tps:<27} {share:>6}  {what}"
