"""Decode TPOT of an export served by vLLM, as JSON lines beside ladder-bench's: ``python -m ladder_train.serve.tpot
EXPORT [EXPORT ...] --tp 2 --out FILE`` (the rows of docs/benchmarks.md, "Served by vLLM").

Per export and overlap setting one engine; per run a batch of ``--batch`` equal random prompts generated greedily
to 1 and to ``--gen-len`` tokens (end-of-sequence ignored): TPOT = (t(gen-len) - t(1)) / (gen-len - 1), the decode
steps alone (the prefill and the engine's per-request work cancel). The ladder runs with its all-reduce held (overlap
on) and with vLLM's all-reduce waited at once (off); other layouts have one setting."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from ..loading import resolve_source
from .layouts import OVERLAP_KEY


def _timed(llm, prompts, tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def measure(path: str, tp: int, overlap: bool, args) -> dict:
    """One engine's row: its TPOT per run and their median."""
    import torch
    from vllm import LLM

    model = resolve_source(path).args
    prompt = torch.randint(0, model.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0))
    prompts = [{"prompt_token_ids": prompt.tolist()}] * args.batch
    start = time.perf_counter()
    llm = LLM(
        path,
        tensor_parallel_size=tp,
        enforce_eager=args.eager,
        dtype="float32",
        skip_tokenizer_init=True,
        hf_overrides={OVERLAP_KEY: overlap, "architectures": ["LadderLlamaForCausalLM"]},
        gpu_memory_utilization=0.05,
        kv_cache_memory_bytes=args.kv_cache_mib * 2**20,
        max_model_len=model.max_seq_len,
        seed=0,
    )
    started = time.perf_counter() - start
    for _ in range(args.warmup):
        _timed(llm, prompts, args.gen_len)
    tpots = []
    for _ in range(args.runs):
        first, whole = _timed(llm, prompts, 1), _timed(llm, prompts, args.gen_len)
        tpots.append((whole - first) / (args.gen_len - 1) * 1e3)
    llm.llm_engine.engine_core.shutdown()
    return {
        "engine": "vllm",
        "model": path,
        "layout": model.residual if model.residual != "ladder" or not model.ladder_layers else "hybrid",
        "tp": tp,
        "overlap": overlap if model.residual == "ladder" else None,
        "compiled": not args.eager,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "tpot_ms": statistics.median(tpots),
        "tpot_ms_runs": tpots,
        "engine_start_s": started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="*", help="export folders (or --preset: random weights)")
    parser.add_argument("--preset", help="a model preset, exported with random weights per --layouts into --work")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="ModelArgs overrides of --preset")
    parser.add_argument("--layouts", default="standard,ladder")
    parser.add_argument("--work", type=Path, help="where --preset's exports are written")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--gen-len", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--eager", action="store_true", help="enforce_eager (default: vLLM's compiled forward)")
    parser.add_argument("--kv-cache-mib", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.preset:
        args.exports += random_exports(args.preset, args.set, args.layouts.split(","), args.work)
    for path in args.exports:
        ladder = resolve_source(path).args.residual == "ladder"
        for overlap in (True, False) if ladder else (True,):
            row = {**measure(path, args.tp, overlap, args), **environment()}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with open(args.out, "a") as out:
                out.write(json.dumps(row) + "\n")
            print(json.dumps(row))


def random_exports(preset: str, sets: list[str], layouts: list[str], work: Path) -> list[str]:
    """Exports of ``preset`` (``sets``: integer overrides) in each layout, random weights (seed 0): speed only."""
    import torch

    from ..model import Transformer, preset_args
    from ..model.hf_format import save_export

    fields = {key: int(value) for key, value in (item.split("=", 1) for item in sets)}
    paths = []
    for layout in layouts:
        torch.manual_seed(0)
        model = Transformer(preset_args(preset, residual=layout, **fields))
        paths.append(str(save_export(model, work / layout)))
    return paths


def environment() -> dict:
    """What a row was measured on and by which command."""
    import torch
    import vllm

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m ladder_train.serve.tpot", *sys.argv[1:]]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "vllm": vllm.__version__,
    }


if __name__ == "__main__":
    main()
