"""docs/benchmarks.md's tables of the developer benchmarks (``benchmarks/``), made from the JSON lines their
``--out`` appends under ``docs/results/`` (each table's file: ``manifest.toml``).

A sample is one repeat of one invocation (``invocation``, ``repeat``). Every figure with more than one sample is
shown as its median with the lowest and highest in brackets; a ratio (pipeline against the raw tokenizer, trainer
against the bare loop) is taken within each sample, side by side, before its median.
"""

from __future__ import annotations

import json
import statistics

from benchmarks.loss_ab import LOSS_VARIANTS, loss_ratios
from benchmarks.records import pair_ratios
from ladder_train.report.tables import markdown_table, spread


def by_sample(rows: list[dict]) -> dict[tuple, list[dict]]:
    """The rows of each sample (invocation, repeat), in file order."""
    samples: dict[tuple, list[dict]] = {}
    for row in rows:
        samples.setdefault((row["invocation"], row.get("repeat", 0)), []).append(row)
    return samples


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def provenance(rows: list[dict], path: str, libraries: tuple[str, ...] = ("torch",)) -> str:
    """Where and when: the dates, CPU model and cores, library versions, invocations and samples, the file."""
    hosts = {json.dumps(row["host"], sort_keys=True): row["host"] for row in rows}.values()
    machines = "; ".join(sorted({f"{h['cpu_model']} ({h['cpu_count']} cores)" for h in hosts}))
    libs = ", ".join(f"{name} {'/'.join(sorted({str(h['versions'].get(name)) for h in hosts}))}" for name in libraries)
    dates = ", ".join(sorted({row["date"] for row in rows}))
    invocations = len({row["invocation"] for row in rows})
    commands = "; ".join(f"`{command}`" for command in dict.fromkeys(row["command"] for row in rows))
    return (
        f"Measured {dates} on {machines}, {libs}: {_count(len(by_sample(rows)), 'sample')} from "
        f"{_count(invocations, 'invocation')} ({commands}), rows in `{path}`."
    )


def data_pipeline(rows: list[dict], path: str) -> str:
    """benchmarks/data_loader.py: tokens/s of the raw tokenizer calls and of a pass of the loader per worker count,
    per worker, and against each raw call of the same sample."""
    body = []
    for batch in dict.fromkeys(row["batch_size"] for row in rows):
        body += _batch_lines(batch, [s for s in by_sample(rows).values() if s[0]["batch_size"] == batch])
    header = ["", "batch", "tokens/s total", "per worker", "/ `encode_batch`", "/ `encode_batch_fast`"]
    first = rows[0]
    raw_tokens = next(r["tokens"] for r in rows if r["quantity"] == "raw")
    return (
        markdown_table(header, body)
        + f"\n\nMedians (lowest–highest) over the samples; each ratio is taken within a sample, then its median. "
        f"Source: `{first['source']}` ({first['split']}), {first['documents']:,} documents, "
        f"{first['characters'] / 1e6:.1f}M characters, {raw_tokens:,} tokens; windows of {first['seq_len'] + 1} "
        f"tokens; tokenization single-threaded. "
        + provenance(rows, path, ("torch", "tokenizers", "datasets", "torchdata"))
        + "\n"
    )


def _batch_lines(batch: int, samples: list[list[dict]]) -> list[list[str]]:
    """One batch size's lines: the two raw tokenizer calls, then the loader per worker count; every ratio is taken
    against the raw calls of the same sample."""
    raw = [{r["call"]: r["tokens_per_s"] for r in s if r["quantity"] == "raw"} for s in samples]
    fast = spread([r["encode_batch_fast"] / r["encode_batch"] for r in raw], ".2f")
    lines = [
        ["raw `encode_batch`, 1 thread", str(batch), spread([r["encode_batch"] for r in raw], ",.0f"), "", "1.00", ""],
        [
            "raw `encode_batch_fast`, 1 thread",
            str(batch),
            spread([r["encode_batch_fast"] for r in raw], ",.0f"),
            "",
            fast,
            "1.00",
        ],
    ]
    workers = dict.fromkeys(r["workers"] for s in samples for r in s if r["quantity"] == "pipeline")
    for count in workers:  # (total tokens/s, the same sample's raw rates) of the samples that ran this count
        pairs = [
            (r["tokens_per_s"], rates)
            for s, rates in zip(samples, raw, strict=True)
            for r in s
            if r["quantity"] == "pipeline" and r["workers"] == count
        ]
        per = [(total / max(count, 1), rates) for total, rates in pairs]
        lines.append(
            [
                f"pipeline, {count} worker{'s' if count != 1 else ''}" + (" (main process)" if count == 0 else ""),
                str(batch),
                spread([total for total, _ in pairs], ",.0f"),
                spread([p for p, _ in per], ",.0f"),
                spread([p / rates["encode_batch"] for p, rates in per], ".2f"),
                spread([p / rates["encode_batch_fast"] for p, rates in per], ".2f"),
            ]
        )
    return lines


def trainer_overhead(rows: list[dict], path: str) -> str:
    """benchmarks/train_step.py: the best round of the bare loop and of the trainer in each sample, and their
    ratio."""
    best = {"bare": [], "trainer": []}
    for sample in by_sample(rows).values():
        for loop in best:
            best[loop].append(max(r["tokens_per_s"] for r in sample if r["loop"] == loop))
    ratio = [t / b for t, b in zip(best["trainer"], best["bare"], strict=True)]
    first = rows[0]
    body = [
        ["bare loop", spread(best["bare"], ",.0f"), "1.000"],
        ["trainer", spread(best["trainer"], ",.0f"), spread(ratio, ".3f")],
    ]
    m = first["model"]
    steps = sorted({r["steps"] for r in rows})
    return (
        markdown_table(["", f"tokens/s, best of {first['rounds']} rounds", "/ bare loop"], body)
        + f"\n\nOverhead (1 - trainer / bare): {spread([100 * (1 - x) for x in ratio], '.1f', ' %')} "
        f"over {len(ratio)} samples of alternating rounds; every round ran {'/'.join(map(str, steps))} steps, each "
        f"trainer round in a fresh run folder. Model: {m['residual']}, {m['n_layers']} layers, dim {m['dim']}, "
        f"{m['n_heads']} heads, FFN {m['ffn_dim']}, vocab {m['vocab_size']} ({first['parameters']:,} parameters); "
        f"seq {first['seq_len']}, global batch {first['global_batch_size']} in micro-batches of "
        f"{first['micro_batch_size']}; {first['dtype']} on {first['device']}. " + provenance(rows, path) + "\n"
    )


def _compiled(rows: list[dict]) -> str:
    """compiled, eager, or which variant was compiled."""
    compiled = sorted({name for r in rows for name, flag in r["compiled"].items() if flag})
    variants = sorted({name for r in rows for name in r["compiled"]})
    if not compiled:
        return "eager"
    return "compiled" if compiled == variants else "compiled: " + ", ".join(compiled)


def trainer_ab(rows: list[dict], path: str) -> str:
    """benchmarks/train_ab.py: each variant's time per block call over its rounds, and b's tokens/s over a's within
    each alternating pair."""
    ratios = pair_ratios(rows)
    body = []
    for name in ("a", "b"):
        mine = [r for r in rows if r["variant"] == name]
        settings = "; ".join(sorted({", ".join(r["variants"][name]) for r in mine}))
        body.append(
            [
                f"{name}: `{settings}`",
                spread([r["step_ms_per_block_call"] for r in mine], ".3f"),
                spread([r["tokens_per_s"] for r in mine], ",.0f"),
                "1.000" if name == "a" else spread(ratios, ".3f"),
            ]
        )
    first, m = rows[0], rows[0]["model"]
    timed = "/".join(str(x) for x in sorted({r["timed_steps"] for r in rows}))
    steps = "/".join(str(x) for x in sorted({r["steps"] for r in rows}))
    return (
        markdown_table(["variant", "step ms per block call", "tokens/s", "/ a, within each pair"], body)
        + f"\n\n{len(ratios)} alternating pairs of rounds, each round the real trainer in a fresh run folder, timed "
        f"over its last {timed} of {steps} steps (the log interval that ends it); a block call is one block's forward "
        f"and backward ({first['block_calls_per_step']} a step). Model: {m['residual']}, {m['n_layers']} layers, dim "
        f"{m['dim']}, {m['n_heads']} heads, FFN {m['ffn_dim']}, vocab {m['vocab_size']} ({first['parameters']:,} "
        f"parameters); seq {first['seq_len']}, global batch {first['global_batch_size']} in micro-batches of "
        f"{first['micro_batch_size']}; {first['dtype']} on {first['device']}, {_compiled(rows)}, torch threads "
        f"{'/'.join(sorted({str(r['host']['torch_threads']) for r in rows}))}. " + provenance(rows, path) + "\n"
    )


def launch_ab(rows: list[dict], path: str) -> str:
    """benchmarks/launch_ab.py: each variant's whole command, wall and the machine's busy CPU seconds over its rounds,
    and b's over a's within each alternating pair."""
    body = []
    for name in ("a", "b"):
        mine = [r for r in rows if r["variant"] == name]
        settings = "; ".join(sorted({", ".join(r["variants"][name]) for r in mine}))
        cells = [f"{name}: `{settings}`"]
        for field in ("wall_s", "busy_cpu_s"):
            ratios = pair_ratios(rows, field)
            cells += [spread([r[field] for r in mine], ".1f"), "1.00" if name == "a" else spread(ratios, ".2f")]
        body.append(cells)
    configs = ", ".join(sorted({" ".join([r["config"], *r["overrides"]]) for r in rows}))
    header = ["variant", "wall s", "/ a, within each pair", "busy CPU s (machine)", "/ a, within each pair"]
    return (
        markdown_table(header, body)
        + f"\n\n{_count(len(pair_ratios(rows, 'wall_s')), 'alternating pair')} of rounds of `ladder-train --config {configs}`, "
        "each the whole command from launch to exit in a fresh run folder; busy CPU is every core's over the round's "
        "interval (/proc/stat), the machine otherwise quiet. " + provenance(rows, path) + "\n"
    )


LOSS_TIME_FIELDS = ("seconds_per_call", "user_s_per_call", "system_s_per_call")  # benchmarks/loss_ab.py, per call


def compiled_loss(rows: list[dict], path: str) -> str:
    """benchmarks/loss_ab.py: the loss's forward and backward, eager and compiled, in wall and CPU time (on a GPU:
    wall time and peak memory), and eager's over the compiled one's within each pair."""
    if rows[0].get("device") == "cuda":
        return compiled_loss_on_gpu(rows, path)
    body = []
    for name in LOSS_VARIANTS:
        mine = [r for r in rows if r["variant"] == name]
        body.append(
            [name]
            + [spread([1e3 * r[field] for r in mine], ".0f") for field in LOSS_TIME_FIELDS]
            + [
                "1.00" if name == "compiled" else spread(loss_ratios(rows, field), ".2f")
                for field in LOSS_TIME_FIELDS[:2]
            ]
        )
    first = rows[0]
    entries = first["tokens"] * first["vocab"]
    faults = {v: statistics.median(r["page_faults_per_call"] for r in rows if r["variant"] == v) for v in LOSS_VARIANTS}
    header = ["loss", "wall ms", "user CPU ms", "system CPU ms", "eager / compiled, wall", "eager / compiled, user CPU"]
    return (
        markdown_table(header, body)
        + f"\n\n{len(loss_ratios(rows))} alternating pairs of rounds of {first['calls']} forward and backward calls of "
        f"`model.TokenLoss` ({first['tokens']:,} tokens, dim {first['dim']}, vocab {first['vocab']:,}: "
        f"{entries:,} logits; {first['dtype']}, torch threads "
        f"{'/'.join(sorted({str(r['host']['torch_threads']) for r in rows}))}), medians (lowest–highest) per call; the "
        "ratios are taken within each pair. System CPU time goes with the minor page faults of each fresh large "
        f"buffer the kernel maps in (per call, eager {faults['eager']:,.0f}, compiled {faults['compiled']:,.0f}), "
        "which a GPU's caching allocator does not pay: the user CPU ratio is the closer stand-in for a GPU. "
        + provenance(rows, path)
        + "\n"
    )


def compiled_loss_on_gpu(rows: list[dict], path: str) -> str:
    """compiled_loss of rows measured on a GPU: wall time, and the peak bytes above the inputs per logit."""
    first = rows[0]
    entries = first["tokens"] * first["vocab"]
    body = []
    for name in LOSS_VARIANTS:
        mine = [r for r in rows if r["variant"] == name]
        body.append(
            [
                name,
                spread([1e3 * r["seconds_per_call"] for r in mine], ".2f"),
                spread([r["peak_bytes_over_inputs"] / 2**20 for r in mine], ",.0f"),
                spread([r["peak_bytes_over_inputs"] / entries for r in mine], ".2f"),
                "1.00" if name == "compiled" else spread(loss_ratios(rows), ".2f"),
            ]
        )
    header = ["loss", "ms a call", "peak MiB above the inputs", "peak B per logit", "eager / compiled, wall"]
    cards = ", ".join(sorted({r["host"]["gpu"] for r in rows}))
    return (
        markdown_table(header, body)
        + f"\n\n{len(loss_ratios(rows))} alternating pairs of rounds of {first['calls']} forward and backward calls of "
        f"`model.TokenLoss` ({first['tokens']:,} tokens, dim {first['dim']}, vocab {first['vocab']:,}: "
        f"{entries:,} logits; {first['dtype']}) on {cards}, medians (lowest–highest) per call; the ratios are taken "
        "within each pair; the peak includes the gradients of the hidden states and the head. "
        + provenance(rows, path)
        + "\n"
    )


def checkpoint_stall(rows: list[dict], path: str) -> str:
    """benchmarks/checkpoint_stall.py part 1: per checkpoint setting, the training's total time, its median step
    and the stall per save."""
    stalls = [r for r in rows if r["part"] == "stall"]
    body = []
    for setting in dict.fromkeys(r["setting"] for r in stalls):
        of = [r for r in stalls if r["setting"] == setting]
        stall = [r["stall_per_save_s"] for r in of if r["stall_per_save_s"] is not None]
        label = setting + (" (`checkpoint.async_save=true`)" if of[0]["async_save"] else "")
        body.append(
            [
                label,
                str(of[0]["saves"]),
                spread([r["total_s"] for r in of], ".2f"),
                spread([r["median_step_s"] for r in of], ".3f"),
                spread(stall, ".3f") if stall else "-",
            ]
        )
    steps = "/".join(map(str, sorted({r["steps"] for r in stalls})))
    header = ["checkpoints", "saves", f"total s ({steps} steps)", "median step s", "stall per save s"]
    return (
        markdown_table(header, body)
        + "\n\nStall = median wall of the step intervals holding a save minus the median of the others, per training; "
        "medians (lowest–highest) over the samples. " + provenance(stalls, path) + "\n"
    )


def checkpoint_sizes(rows: list[dict], path: str) -> str:
    """benchmarks/checkpoint_stall.py part 2: per model width, the DCP checkpoint's size and its save and load
    times."""
    sizes = [r for r in rows if r["part"] == "size"]
    body = []
    for dim in dict.fromkeys(r["dim"] for r in sizes):
        of = [r for r in sizes if r["dim"] == dim]
        mib = statistics.median(r["bytes"] / 2**20 for r in of)
        body.append(
            [
                str(dim),
                f"{of[0]['params']:,}",
                f"{mib:,.1f}",
                spread([r["save_s"] for r in of], ".3f"),
                spread([r["load_s"] for r in of], ".3f"),
                spread([r["bytes"] / 2**20 / r["save_s"] for r in of], ",.0f"),
            ]
        )
    header = ["dim", "parameters", "checkpoint MiB", "save s", "load s", "save MiB/s"]
    return (
        markdown_table(header, body)
        + "\n\nModel + AdamW state saved and loaded by the trainer's `Checkpointer` (DCP, one process); medians "
        "(lowest–highest) over the samples. " + provenance(sizes, path) + "\n"
    )


def activation_memory(rows: list[dict], path: str) -> str:
    """benchmarks/activation_memory.py's rows: the memory held after forward and the peak of each layout and
    checkpointing mode, each against the layout's mode none, with the loss and the gradients' largest difference."""
    none = {row["layout"]: row for row in rows if row["mode"] == "none"}
    body = []
    for row in rows:
        base, held, peak = none[row["layout"]], row["held_after_forward_bytes"], row["peak_bytes"]
        body.append(
            [
                row["layout"],
                row["mode"],
                f"{held / 2**20:,.1f}",
                f"{held / base['held_after_forward_bytes']:.2f}",
                f"{peak / 2**20:,.1f}",
                f"{peak / base['peak_bytes']:.2f}",
                f"{row['loss']:.6f}",
                f"{row['max_grad_diff']:g}",
            ]
        )
    header = ["layout", "mode", "held MiB", "/ none", "peak MiB", "/ none", "loss", "max grad diff to none"]
    return markdown_table(header, body) + "\n"
