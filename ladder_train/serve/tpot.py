"""Decode TPOT of an export served by vLLM, as JSON lines beside ladder-bench's: ``python -m ladder_train.serve
EXPORT [EXPORT ...] --tp 2 --out FILE`` (its flags: ladder_train/cli/serve_bench.py; the rows of docs/benchmarks.md,
"Served by vLLM").

Per export and overlap setting one engine; per run a batch of ``--batch`` equal random prompts generated greedily
to 1 and to ``--gen-len`` tokens (end-of-sequence ignored): TPOT = (t(gen-len) - t(1)) / (gen-len - 1), the decode
steps alone (the prefill and the engine's per-request work cancel). The ladder runs with its all-reduce held (overlap
on) and with vLLM's all-reduce waited at once (off); other layouts have one setting."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..loading import resolve_source
from .layouts import OVERLAP_KEY


@dataclass(frozen=True)
class TpotOptions:
    """What one invocation measures (the command line's flags, checked there)."""

    out: Path
    exports: list[str] = field(default_factory=list)
    preset: str | None = None
    overrides: dict = field(default_factory=dict)  # ModelArgs fields of --preset
    layouts: tuple[str, ...] = ("standard", "ladder")
    work: Path | None = None
    tp: int = 2
    batch: int = 1
    prompt_len: int = 8
    gen_len: int = 16
    warmup: int = 1
    runs: int = 3
    eager: bool = False
    kv_cache_mib: int = 64


def _timed(llm, prompts, tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def measure(path: str, tp: int, overlap: bool, options: TpotOptions) -> dict:
    """One engine's row: its TPOT per run and their median."""
    import torch
    from vllm import LLM

    model = resolve_source(path).args
    prompt = torch.randint(0, model.vocab_size, (options.prompt_len,), generator=torch.Generator().manual_seed(0))
    prompts = [{"prompt_token_ids": prompt.tolist()}] * options.batch
    start = time.perf_counter()
    llm = LLM(
        path,
        tensor_parallel_size=tp,
        enforce_eager=options.eager,
        dtype="float32",
        skip_tokenizer_init=True,
        hf_overrides={OVERLAP_KEY: overlap, "architectures": ["LadderLlamaForCausalLM"]},
        gpu_memory_utilization=0.05,
        kv_cache_memory_bytes=options.kv_cache_mib * 2**20,
        max_model_len=model.max_seq_len,
        seed=0,
    )
    started = time.perf_counter() - start
    for _ in range(options.warmup):
        _timed(llm, prompts, options.gen_len)
    tpots = []
    for _ in range(options.runs):
        first, whole = _timed(llm, prompts, 1), _timed(llm, prompts, options.gen_len)
        tpots.append((whole - first) / (options.gen_len - 1) * 1e3)
    llm.llm_engine.engine_core.shutdown()
    return {
        "engine": "vllm",
        "model": path,
        "layout": model.residual if model.residual != "ladder" or not model.ladder_layers else "hybrid",
        "tp": tp,
        "overlap": overlap if model.residual == "ladder" else None,
        "compiled": not options.eager,
        "batch": options.batch,
        "prompt_len": options.prompt_len,
        "gen_len": options.gen_len,
        "tpot_ms": statistics.median(tpots),
        "tpot_ms_runs": tpots,
        "engine_start_s": started,
    }


def run_rows(options: TpotOptions) -> None:
    """Every export (and --preset's, written first) measured, the ladder with its all-reduce held and with vLLM's;
    each row appended to ``options.out`` as it is measured and printed."""
    exports = list(options.exports)
    if options.preset:
        exports += random_exports(options.preset, options.overrides, list(options.layouts), options.work)
    for path in exports:
        ladder = resolve_source(path).args.residual == "ladder"
        for overlap in (True, False) if ladder else (True,):
            row = {**measure(path, options.tp, overlap, options), **environment()}
            options.out.parent.mkdir(parents=True, exist_ok=True)
            with open(options.out, "a") as out:
                out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def random_exports(preset: str, fields: dict, layouts: list[str], work: Path) -> list[str]:
    """Exports of ``preset`` (``fields``: ModelArgs overrides) in each layout, random weights (seed 0): speed only."""
    import torch

    from ..model import Transformer, preset_args
    from ..model.hf_format import save_export

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
        "command": " ".join(["python -m ladder_train.serve", *sys.argv[1:]]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "vllm": vllm.__version__,
    }
