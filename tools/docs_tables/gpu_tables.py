"""docs/benchmarks.md's GPU tables, made from the rows ``python -m benchmarks.gpu_check --out`` appends (one file per
card and date under ``docs/results/gpu/``; each table's file: ``manifest.toml``).

Every training figure is one run: tokens/s is the median of its logged steps after compilation with the lowest and
highest step in brackets, MFU the median step's. A ``ceilings`` row (a device-to-device copy and an 8192-cube bf16
matrix product timed on the same card) gives decode's bandwidth as a share of the copy rate the card reached.
"""

from __future__ import annotations

from pathlib import Path

from ladder_train.report.tables import markdown_table

MODEL_OF_RECIPE = {"1b": "1.2B", "3b": "3.5B"}


def _model(recipe: str) -> str:
    return MODEL_OF_RECIPE.get(Path(recipe).stem.rsplit("_", 1)[-1], Path(recipe).stem)


def _env_line(rows: list[dict], path: str) -> str:
    """Card, driver, torch, date and the gpu_check invocations of ``rows``."""
    envs = [r["env"] for r in rows if "env" in r]
    first = envs[0]
    commands = sorted({e["command"] for e in envs})
    return (
        f"{first['card']}, driver {first['driver']}, torch {first['torch']} (CUDA {first['cuda']}), {first['date']}; "
        f"{len(commands)} invocation(s): " + "; ".join(f"`{c}`" for c in commands) + f". Rows: `{path}`."
    )


def _tokens(row: dict) -> str:
    low, high = row["tokens_per_s_min"], row["tokens_per_s_max"]
    return f"{row['tokens_per_s_median']:,.0f} ({low:,.0f}–{high:,.0f})"


def _table(all_rows: list[dict], path: str, kinds: tuple[str, ...], header: list[str], line, note) -> str:
    """The table of ``path``'s rows of ``kinds`` that did not fail: ``line(row, all_rows)`` each, then
    ``note(all_rows)`` and the card, driver, torch, date and commands of those rows."""
    rows = [r for r in all_rows if r["kind"] in kinds and not r.get("error")]
    body = [line(r, all_rows) for r in rows]
    return markdown_table(header, body) + "\n\n" + note(all_rows) + _env_line(rows, path) + "\n"


def _mode(row: dict) -> str:
    """compiled or eager, and the overrides of a gpu_check ``--variant``."""
    return ", ".join(["compiled" if row["compiled"] else "eager", *(f"`{x}`" for x in row.get("variant", []))])


def _training_line(r: dict, _) -> list[str]:
    error = r.get("plan_rel_error")
    return [
        _model(r["recipe"]),
        r["layout"],
        str(r["micro_batch"]),
        r.get("plan_accumulation") or "-",
        _mode(r),
        f"{r['measured_steps'][0]}–{r['measured_steps'][1]}",
        _tokens(r),
        f"{100 * r['mfu_median']:.1f} %",
        f"{r['peak_mem_gib']:.2f}",
        f"{r['plan_total_gib']:.2f}",
        "-" if error is None else f"{100 * error:+.1f} %",
    ]


def training(rows: list[dict], path: str) -> str:
    """Training rows (kind train and big): tokens/s, MFU and peak memory against the ``--dry-run`` plan."""
    header = ["model", "layout", "micro-batch", "gradients", "mode", "steps", "tokens/s median (range)", "MFU"]
    header += ["peak GiB", "plan GiB", "plan − peak"]
    note = (
        "One run per row, global batch as gpu_check sets it (16 sequences of 2048 at 1.2B, 4 at 3.5B); MFU against "
        "the card's dense bf16 peak, with the trainer's FLOPs per token: 6 x parameters + 12 x layers x dim x seq, "
        "the attention term (17 % of the 1.2B's count at seq 2048) with no discount for the causal mask. "
    )
    return _table(rows, path, ("train", "big"), header, _training_line, lambda _: note)


def _profile_line(r: dict, _) -> list[str]:
    return [
        r["layout"],
        str(r["micro_batch"]),
        str(r["steps_traced"]),
        f"{100 * r['busy_share']:.1f} %",
        f"{r['host_step_ms']:,.0f}",
        f"{r['kernels_per_step']:,.0f}",
        f"{r['copies_per_step']:,.0f}",
        f"{r['memsets_per_step']:,.0f}",
        f"{r['runtime_calls_per_step']:,.0f}",
    ]


def profiled(rows: list[dict], path: str) -> str:
    """Profiled rows: the GPU's busy share of the traced steps and the work per optimizer step."""
    header = ["layout", "micro-batch", "steps traced", "GPU busy", "host ms a step", "kernels a step"]
    header += ["copies a step", "memsets a step", "CUDA runtime + driver calls a step"]
    note = (
        "1.2B, compiled, global batch 16; busy = the union of kernel, copy and memset intervals over the traced span "
        "in a profiled run: torch.profiler slows the host, so an unprofiled step's busy share is higher (the H100's "
        "micro-batch 2 step took 1,251 ms profiled and 969 ms unprofiled: busy about 63 % at the same GPU work). "
    )
    return _table(rows, path, ("profile",), header, _profile_line, lambda _: note)


def _ceilings(all_rows: list[dict]) -> dict | None:
    return next((r for r in all_rows if r["kind"] == "ceilings"), None)


def _decode_line(r: dict, all_rows: list[dict]) -> list[str]:
    ceilings = _ceilings(all_rows)
    copy = ceilings["copy_tb_s_median"] * 1e3 if ceilings else None
    return [
        r["model"],
        r["layout"],
        {True: "on", False: "off"}.get(r.get("gemv_tuning"), "off (not yet a setting)"),
        str(r["n_layers"]),
        str(r["batch"]),
        f"{r['prompt_len']} + {r['gen_len']}",
        f"{r['tpot_ms']:.3f} ± {r['tpot_sd_ms']:.3f}",
        f"{r['weight_bytes'] / 1e6:,.0f}",
        f"{r['bandwidth_gb_s']:,.0f}",
        "-" if copy is None else f"{100 * r['bandwidth_gb_s'] / copy:.0f} % of {copy:,.0f}",
    ]


def _decode_note(all_rows: list[dict]) -> str:
    note = "TP 1, bf16, compiled with CUDA graphs; bandwidth = parameters × 2 B / TPOT (the KV cache not counted). "
    c = _ceilings(all_rows)
    if c:
        note += (
            f"Copy rate (`benchmarks/gpu_ceilings.py`): a {c['copy']['bytes_read_plus_written'] / 2**31:g} GiB "
            f"device-to-device copy, bytes read plus written, median of {c['copy']['repeats']}; the same card's "
            f"{c['matmul']['n']}³ bf16 matrix product ran at {c['matmul_tflops_median']:.0f} TFLOP/s "
            f"(median of {c['matmul']['repeats']}). "
        )
    return note


def decoding(rows: list[dict], path: str) -> str:
    """Decode rows: TPOT and the weights' read bandwidth, with its share of the card's measured copy rate."""
    header = ["model", "layout", "GEMV tuning", "layers", "batch", "prompt + new", "TPOT ms (sd over runs)"]
    header += ["weights MB", "weights read GB/s", "of the copy rate (GB/s)"]
    return _table(rows, path, ("decode",), header, _decode_line, _decode_note)


def _ratio(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _peer_line(r: dict, _) -> list[str]:
    """A row of gpu_check --peers (benchmarks/peers.py): the peer's figure, our MFU formula on it, ours beside."""
    if r["kind"] == "peer_decode":
        how = "compiled" if r["compiled"] else "eager"
        tuning = {True: ", GEMV tuned", False: ", GEMV untuned"}.get(r.get("ours_gemv_tuning"), "")
        ours = "-" if r.get("ours_tpot_ms") is None else f"TPOT {r['ours_tpot_ms']:.3f} ms{tuning}"
        return [
            "decode",
            f"transformers {r['peer_version']} (static cache, {how})",
            "batch 1",
            f"TPOT {r['tpot_ms']:.3f} ms ({r['n_layers']} layers, {r['prompt_len']} + {r['gen_len']})",
            "-",
            ours,
            _ratio(r.get("ours_over_theirs")),
        ]
    share = "-" if r.get("mfu_median") is None else f"{100 * r['mfu_median']:.1f} %"
    ours = "-" if r.get("ours_tokens_per_s") is None else f"{r['ours_tokens_per_s']:,.0f}"
    if r["kind"] == "peer_train":
        part, peer, ratio = "training", f"torchtitan {r['peer_version']} ({r['precision']})", r.get("ours_over_theirs")
    else:
        part, peer, ratio = "training", f"our model, bare loop ({r['accumulate']})", r.get("trainer_over_bare")
    return [part, peer, str(r["micro_batch"]), _tokens(r) + " tokens/s", share, ours, _ratio(ratio)]


def peers(rows: list[dict], path: str) -> str:
    """Rows of ``gpu_check --peers``: torchtitan and the bare loop beside our training rows, transformers beside our
    decode, ours / theirs from the same invocation. Not yet in manifest.toml: it waits for a card's committed rows."""
    header = ["part", "theirs", "micro-batch", "their figure", "MFU (our formula)", "ours", "ours / theirs"]
    note = (
        "One run per row, all from one gpu_check invocation. Training: 1.2B standard, seq 2048, global batch 16, "
        "compiled, bf16, tokens/s median over the steps after compilation (range in brackets); theirs in brackets: "
        "FSDP2 or autocast, as its log said; torchtitan's Llama has an untied head (+ vocab x dim parameters, the "
        "same FLOPs per token); ours = our trainer's tokens/s at that micro-batch, over the bare loop's: the "
        "trainer's own cost. Decode: our export of the same model (random weights) in LlamaForCausalLM, batch 1, "
        "greedy, TPOT = (generate of N tokens - of 1) / (N - 1); ours / theirs below 1: ours is faster. "
    )
    return _table(rows, path, ("peer_train", "bare_loop", "peer_decode"), header, _peer_line, lambda _: note)
