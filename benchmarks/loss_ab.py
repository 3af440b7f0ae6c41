"""The trainer's loss (model.TokenLoss) eager against compiled: its forward and backward alone, side by side.

    python -m benchmarks.loss_ab [--tokens 4096] [--dim 16] [--vocab 49152] [--rounds 5] [--calls 5]
                                 [--threads 1] [--device cpu|cuda] [--out FILE.jsonl]

bf16 hidden states and head, as the trainer's compute dtype gives them, at a shape whose passes over the tokens x
vocabulary entries set the time rather than the head's matrix product (dim 16 by default): eager writes out the fp32
logits, their log-softmax and its gradient; the compiled loss (inductor, as ``parallel.compile`` compiles it) reads
the bf16 logits inside its reductions and writes their gradient over them. On the CPU that is an emulation of the
bytes the GPU's memory moves, on this machine's memory. ``--device cuda`` measures the real thing, and each round's
peak memory above its inputs (benchmarks/gpu_lease.sh levers runs it at the 1.2B's micro-batch 8: 16,384 tokens, dim
2048).

Each variant first runs one untimed call (compilation). Then ``--rounds`` pairs alternate eager and compiled, each
round ``--calls`` forward and backward calls, so a slower machine hurts both alike; a pair's eager / compiled time is
taken within the pair. Every round checks the work it timed: the two variants' losses agree (BenchmarkError, exit 1,
otherwise). ``--out`` appends one JSON line per timed round.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from benchmarks.records import BenchmarkError, append_rows, invocation, pair_ratios, positive_int, refuse
from ladder_train.model import TokenLoss

LOSS_VARIANTS = ("eager", "compiled")


def loss_ratios(rows: list[dict], field: str = "seconds_per_call") -> list[float]:
    """This benchmark's rows: eager's ``field`` over the compiled loss's within each pair."""
    return pair_ratios(rows, field, over="eager", under="compiled")


def inputs(tokens: int, dim: int, vocab: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Hidden states (1, tokens, dim) and head (vocab, dim) in bf16, scaled like a trained model's logits; labels with
    one in eight not scored."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(1, tokens, dim, generator=gen).bfloat16().to(device).requires_grad_()
    head = (torch.randn(vocab, dim, generator=gen) / dim**0.5).bfloat16().to(device).requires_grad_()
    labels = torch.randint(0, vocab, (1, tokens), generator=gen)
    labels[0, ::8] = -100
    return h, head, labels.to(device)


def timed_round(loss_fn, h, head, labels, calls: int) -> dict:
    """Per forward and backward call: wall seconds, the process's user and system CPU seconds and its minor page
    faults (the kernel mapping in each fresh large buffer, which a GPU's caching allocator does not do); on a GPU the
    peak bytes allocated above what the round started with; the last call's loss."""
    cuda = h.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(calls):
        loss = loss_fn(h, head, labels)
        loss.backward()
        h.grad = head.grad = None
    if cuda:
        torch.cuda.synchronize()
    wall, ended = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds_per_call": wall / calls,
        "user_s_per_call": (ended.ru_utime - cpu.ru_utime) / calls,
        "system_s_per_call": (ended.ru_stime - cpu.ru_stime) / calls,
        "page_faults_per_call": (ended.ru_minflt - cpu.ru_minflt) / calls,
        "peak_bytes_over_inputs": torch.cuda.max_memory_allocated() - held if cuda else None,
        "loss": float(loss.detach()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=positive_int, default=4096, help="tokens of a micro-batch")
    parser.add_argument("--dim", type=positive_int, default=16, help="model width (the head's inner dimension)")
    parser.add_argument("--vocab", type=positive_int, default=49152, help="vocabulary entries")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating pairs of timed rounds")
    parser.add_argument("--calls", type=positive_int, default=5, help="forward and backward calls a round")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch's CPU threads")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the loss runs")
    parser.add_argument("--out", default=None, help="JSON lines file the rows are appended to")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        refuse("benchmarks.loss_ab", "--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)  # before the rows' host record, which reports it
    context = invocation("benchmarks.loss_ab", argv)
    context.update(bench="loss_ab", tokens=args.tokens, dim=args.dim, vocab=args.vocab, calls=args.calls)
    context.update(dtype="bfloat16", device=args.device)
    compiled = TokenLoss()
    compiled.compile(fullgraph=True)
    variants = {"eager": TokenLoss(), "compiled": compiled}
    h, head, labels = inputs(args.tokens, args.dim, args.vocab, torch.device(args.device))
    for loss_fn in variants.values():
        timed_round(loss_fn, h, head, labels, 1)
    rows = []
    for pair in range(args.rounds):
        losses = {}
        for name, loss_fn in variants.items():
            timed = timed_round(loss_fn, h, head, labels, args.calls)
            if args.device == "cpu" and timed["user_s_per_call"] <= 0:  # CPU time ticks coarsely: no ratio from it
                raise BenchmarkError(f"a round of {args.calls} calls used no measurable user CPU time: more --calls")
            losses[name] = timed["loss"]
            rows.append({**context, "round": pair, "variant": name, **timed})
        if abs(losses["compiled"] - losses["eager"]) > 1e-4 * abs(losses["eager"]):
            raise BenchmarkError(f"round {pair}: compiled loss {losses['compiled']} against eager {losses['eager']}")
    for name in LOSS_VARIANTS:
        ms = statistics.median(1e3 * r["seconds_per_call"] for r in rows if r["variant"] == name)
        print(f"{name}: {ms:.1f} ms a forward and backward (median of {args.rounds} rounds)")
    print(f"eager / compiled within each pair: median {statistics.median(loss_ratios(rows)):.3f}")
    append_rows(args.out, rows)


if __name__ == "__main__":
    main()
