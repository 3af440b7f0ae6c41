"""Runs vLLM engines one after another in this process and writes what each generated, for the vLLM tests (which
start it as a subprocess, so no engine outlives its test module): ``python tests/serve_run.py CASES.json OUT.json``.

A case: ``{"name", "path", "tp", "eager", "hf_overrides", "count"}``; each engine greedily completes serve_models'
PROMPTS as one batch and, with ``count``, notes the all-reduces in flight as each module starts
(ladder_train.serve.counting). Out: name -> {"tokens", "logprobs", "in_flight", "start_s"}."""

from __future__ import annotations

import gc
import json
import os
import sys
import time

from serve_models import NEW_TOKENS, PROMPTS

# small machines: the KV cache a tiny model needs, not 92 % of the host's memory; one core per rank
ENGINE_MEMORY = dict(gpu_memory_utilization=0.05, kv_cache_memory_bytes=2**26, max_model_len=128)


def bind_threads(tp: int) -> None:
    """One share of this process's cores per rank (vLLM's CPU workers bind their threads; its automatic binding
    wants a NUMA node per rank), unless VLLM_CPU_OMP_THREADS_BIND is set by the caller."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ and os.environ.get("_SERVE_RUN_BOUND") != "1":
        return
    cpus = sorted(os.sched_getaffinity(0))
    shares = [cpus[i::tp] or cpus[:1] for i in range(tp)]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, share)) for share in shares)
    os.environ["_SERVE_RUN_BOUND"] = "1"


def run_case(case: dict) -> dict:
    from vllm import LLM, SamplingParams

    from ladder_train.serve.counting import in_flight, start_counting

    bind_threads(case["tp"])
    start = time.perf_counter()
    llm = LLM(
        case["path"],
        tensor_parallel_size=case["tp"],
        enforce_eager=case["eager"],
        dtype="float32",
        skip_tokenizer_init=True,
        hf_overrides=case.get("hf_overrides") or None,
        seed=0,
        **ENGINE_MEMORY,
    )
    started = time.perf_counter() - start
    if case.get("count"):
        llm.apply_model(start_counting)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    result = {"start_s": started, "tokens": [], "logprobs": []}
    for out in outputs:
        tokens = list(out.outputs[0].token_ids)
        result["tokens"].append(tokens)
        result["logprobs"].append([step[t].logprob for step, t in zip(out.outputs[0].logprobs, tokens, strict=True)])
    result["in_flight"] = llm.apply_model(in_flight) if case.get("count") else None
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def main(cases_file: str, out_file: str) -> None:
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # apply_model's function, from this package
    results = {}
    for case in json.loads(open(cases_file).read()):
        results[case["name"]] = run_case(case)
        with open(out_file, "w") as f:  # written after each engine: a later failure keeps the earlier results
            json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
