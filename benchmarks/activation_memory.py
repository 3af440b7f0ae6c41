"""Activation memory of the activation-checkpointing modes (none / selective / full), measured on the CPU.

    python -m benchmarks.activation_memory [--layouts standard,parallel,ladder] [--out FILE.jsonl] [key=value ...]

For each layout and mode: the same weights and tokens, blocks wrapped by the trainer's own
``apply_activation_checkpointing``, then one forward (cross-entropy loss included) and backward of one micro-batch
under ``torch.profiler`` with ``profile_memory=True``, which records every allocation and free of the CPU allocator
with its address and size. The bytes live are counted over the blocks allocated while the profiler runs (the
parameters, made before, are not in them). Figures per row:

- ``held_after_forward_bytes``: the total when forward has returned: what autograd keeps for backward (and the logits);
- ``peak_bytes``: the highest total during forward and backward (the gradients included);
- ``loss`` and ``max_grad_diff`` (the largest difference of any gradient element to mode ``none``): the modes
  compute the same function.

Memory does not depend on the machine's load; the recompute time is not measured. Rows go to ``--out`` as JSON lines;
``python -m tools.docs_tables --write`` then remakes docs/benchmarks.md's table from the default file.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile, record_function

from ladder_train.config import load_config, model_args
from ladder_train.files import write_text
from ladder_train.model import Transformer
from ladder_train.parallel.apply import apply_activation_checkpointing

DEFAULTS = [
    "model.vocab_size=4096",
    "model.dim=256",
    "model.n_layers=8",
    "model.n_heads=4",
    "model.ffn_dim=688",
    "model.max_seq_len=512",
    "data.seq_len=512",
    "train.micro_batch_size=4",
]
MODES = ("none", "selective", "full")
OUT = Path("docs/results/activation_memory/cpu.jsonl")


def allocator_totals(prof, marker: str) -> tuple[list[tuple[int, int]], int]:
    """(time ns, bytes live after it) at every allocation and free the profiler saw, in time order, counting only
    blocks allocated while it ran (each free matched to its allocation by address); and the end time of the
    ``record_function`` range named ``marker``. (The events' own running total is not used: it also counts blocks
    of an earlier profiling session that were freed after it ended.)"""
    events, marker_end = [], None
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        if event.tag == _EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.ptr, event.extra_fields.alloc_size))
        elif event.name == marker:
            marker_end = event.end_time_ns
        pending.extend(event.children)
    live: dict[int, int] = {}
    totals, total = [], 0
    for time_ns, ptr, size in sorted(events):
        if size > 0:
            live[ptr] = size
            total += size
        else:
            total -= live.pop(ptr, 0)
        totals.append((time_ns, total))
    return totals, marker_end


def measure(model: Transformer, inputs: torch.Tensor, labels: torch.Tensor) -> dict:
    """One forward and backward of ``model`` (gradients must be None before): the memory figures, the loss and the
    gradients."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("forward"):
            loss = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
        loss.backward()
    totals, forward_end = allocator_totals(prof, "forward")
    return {
        "held_after_forward_bytes": next(total for time_ns, total in reversed(totals) if time_ns <= forward_end),
        "peak_bytes": max(total for _, total in totals),
        "loss": loss.item(),
        "grads": [p.grad.detach().clone() for p in model.parameters()],
    }


def compare_modes(base: Transformer, inputs, labels, every: int = 2) -> dict[str, dict]:
    """``measure`` for each mode on a copy of ``base``, with ``max_grad_diff`` to mode none in place of the grads."""
    results = {}
    for mode in MODES:
        model = copy.deepcopy(base)
        apply_activation_checkpointing(model, mode, every)
        results[mode] = measure(model, inputs, labels)
    for mode in MODES:
        diffs = [
            (g - g0).abs().max().item() for g, g0 in zip(results[mode]["grads"], results["none"]["grads"], strict=True)
        ]
        results[mode]["max_grad_diff"] = max(diffs)
    for figures in results.values():
        del figures["grads"]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="standard,parallel,ladder")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    cfg = load_config(None, DEFAULTS + args.overrides)
    gen = torch.Generator().manual_seed(0)
    shape = (cfg.train.micro_batch_size, cfg.data.seq_len + 1)
    tokens = torch.randint(0, cfg.model.vocab_size, shape, generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    rows = []
    for layout in args.layouts.split(","):
        cfg.model.residual = layout
        torch.manual_seed(cfg.run.seed)
        base = Transformer(model_args(cfg.model))
        for mode, figures in compare_modes(base, inputs, labels).items():
            rows.append(_row(cfg, layout, mode, base, figures))
            print(_line(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, "".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {args.out}")


def _row(cfg, layout: str, mode: str, base: Transformer, figures: dict) -> dict:
    m = cfg.model
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": torch.__version__,
        "layout": layout,
        "mode": mode,
        "model": {
            "dim": m.dim,
            "n_layers": m.n_layers,
            "n_heads": m.n_heads,
            "ffn_dim": m.ffn_dim,
            "vocab_size": m.vocab_size,
        },
        "parameters": sum(p.numel() for p in base.parameters()),
        "batch": cfg.train.micro_batch_size,
        "seq_len": cfg.data.seq_len,
        "dtype": "fp32",
        **figures,
    }


def _line(row: dict) -> str:
    mib = 2**20
    return (
        f"{row['layout']:<9} {row['mode']:<9} held after forward {row['held_after_forward_bytes'] / mib:8.1f} MiB | "
        f"peak {row['peak_bytes'] / mib:8.1f} MiB | loss {row['loss']:.6f} | max grad diff {row['max_grad_diff']:.1e}"
    )


if __name__ == "__main__":
    main()
