"""The speed benchmark behind ``ladder-bench``: tokens/s of the standard, parallel, ladder and desync layouts under
tensor parallelism (its flags: ``cli/bench.py``).

    ladder-bench --model 1.2B --tp 2 --layouts standard,parallel,ladder --batch-sizes 1,4,16,64
    ladder-bench --model small --tp 2 --layouts standard,ladder,desync-2,desync-4 --link-latency-ms 2 --compile off
    torchrun --nproc-per-node 8 -m ladder_train.bench --model 3.5B-32h --out results.jsonl

Without torchrun, ``--tp N`` starts its N ranks itself (forked by a fork server; gloo on the CPU, one thread
each). For every layout and batch size it measures a greedy generation (prefill + decode) with the real
all-reduces and again with every all-reduce skipped (the no-communication ceiling), after warm-up runs, and reports
medians over the measured runs: the speedup over standard in the paper's terms (end-to-end tokens/s,
batch x new tokens / wall time, prefill included) and, beside it, the decode-step speedup; the all-reduces
of one decode step, counted (``comm_count.py``: a desync-K layout, built for the TP degree it runs at, skips
all but every K-th module's); the communication share 1 - t(none)/t(standard) and the overlap efficiency
(t(standard) - t(layout)) / min(t(standard) - t(none), t(none)) of the decode step (docs/benchmarks.md).

``--link-latency-ms X [--link-bandwidth-gbs B]`` emulates a slow interconnect as one serialised link per
TP group, as one NCCL stream is: an all-reduce issued at t starts at max(t, end of the previous one) and
occupies the link X ms + bytes / B; its wait returns no earlier than that end. Eager runs only (host
sleeps), so it needs ``--compile off``.

``--profile DIR`` traces one more, untimed generation of every case per rank (``bench/profiling.py``).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import signal
import time

import torch
import torch.distributed as dist

from ..bench_schema import shape_name, write_rows
from ..inference import Generator, TPCommunicator, comm_mode_for, load_tp_model
from ..inference.tp import make_communicator
from ..lifetime import end_with_parent
from ..option_errors import OptionError
from ..parallel import free_port, init_distributed, resolve_dtype
from .comm_count import all_reduces_per_decode_step
from .environment import cpu_model, invocation
from .module_times import module_times_ms, peak_memory
from .options import COMPILED_WARMUP, BenchOptions, is_saved_model, layout_overrides, measurements
from .profiling import trace_generations
from .results import derive, print_table, summarize

DEFAULT_RUNS = {True: 10, False: 3}  # timed runs per case: on a GPU, on the CPU
RECORDED_ENV = (
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_NVLS_ENABLE",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
)


def environment(device: torch.device, tp: int, options: BenchOptions, compiled: bool, dtype) -> dict:
    """What every row of this invocation shares, flat as bench_schema names it: the invocation and the machine (the
    environment record of ``environment.py``), the device and NCCL, and the settings."""
    nccl = None
    if device.type == "cuda":
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "host": platform.node(),
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "nccl": nccl,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "tp": tp,
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": compiled,
        "compile_backend": options.compile_backend if compiled else None,
        "gemv_tuning": options.gemv_tuning if compiled and device.type == "cuda" else None,
        "emulated_link_latency_ms": options.link_latency_ms,
        "link_bandwidth_gbs": options.link_bandwidth_gbs,
        "link": "emulated serialised" if options.emulated_link else ("gloo" if device.type == "cpu" else "nccl"),
        **invocation(),  # its id, date and start (UTC): rows of several invocations in one file told apart by it
    }


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_generation(
    gen: Generator, prompt: torch.Tensor, gen_len: int, group
) -> tuple[tuple[float, float, float], torch.Tensor]:
    """One greedy generation: (seconds of prefill, seconds per decode step, total seconds) and the tokens.
    The cache is kept (the same tensors, whose addresses a CUDA graph captured) and zeroed before the timer."""
    device = prompt.device
    gen.setup(prompt.shape[0], prompt.shape[1] + gen_len)
    marks = {}

    def prefill_done():
        _sync(device)
        marks["prefill"] = time.perf_counter()

    if group is not None:
        dist.barrier(group)
    _sync(device)
    start = time.perf_counter()
    tokens = gen.generate(prompt, gen_len, on_prefill_done=prefill_done)
    _sync(device)
    end = time.perf_counter()
    if tokens.shape != (prompt.shape[0], gen_len):  # the work that was timed was really done
        raise RuntimeError(
            f"ladder-bench: generated {tuple(tokens.shape)} tokens, expected {(prompt.shape[0], gen_len)}"
        )
    # token 1 comes from the prefill
    return (marks["prefill"] - start, (end - marks["prefill"]) / (gen_len - 1), end - start), tokens


def run_rank(options: BenchOptions):
    """One TP rank (the whole benchmark when TP = 1). Rank 0 prints and writes the results."""
    env = init_distributed(group_of_one=False)
    if env.device.type == "cpu":
        torch.set_num_threads(1 if env.world_size > 1 else torch.get_num_threads())
    dtype = resolve_dtype("auto", env.device)
    cuda = env.device.type == "cuda"
    compiled = options.compile == "on" or (options.compile == "auto" and cuda and not options.emulated_link)
    if compiled and options.warmup < COMPILED_WARMUP:  # compile auto on a GPU: the warm-up a compiled run needs
        options = dataclasses.replace(options, warmup=COMPILED_WARMUP)
    if options.runs is None:  # enough runs for a p90 on a GPU; the CPU's runs are long
        options = dataclasses.replace(options, runs=DEFAULT_RUNS[env.device.type == "cuda"])
    group = dist.group.WORLD if env.world_size > 1 else None
    info = environment(env.device, env.world_size, options, compiled, dtype)
    try:
        entries, reduces = load_entries(options, env.rank, env.world_size, env.device, dtype, group, compiled)
        if compiled:
            cases = sum(len(comms) for *_, comms in entries) * len(options.batch_sizes)
            allow_recompiles(cases)
            compiled_before = compilations()
        rows = []
        for batch in options.batch_sizes:
            if cuda:
                torch.cuda.reset_peak_memory_stats(env.device)
            samples = measure_batch(options, entries, batch, env.device, group)
            memory = peak_memory(env.device)
            rows += [
                {**row, **info, **memory}
                for row in batch_rows(options, entries, reduces, batch, samples, env.device, dtype)
            ]
        if compiled:
            # prefill + decode graph per (model, communicator, batch size); more would be a recompile per step
            info["compilations"] = compilations() - compiled_before
            if info["compilations"] > 2 * cases:
                raise RuntimeError(f"ladder-bench: {info['compilations']} compilations for {cases} cases: recompiling")
            rows = [{**row, "compilations": info["compilations"]} for row in rows]
        if env.rank == 0:
            derive(rows)
            print_table(rows, info)
            if options.out:
                write_rows(rows, options.out)
                print(f"results appended to {options.out}")
    finally:
        if group is not None:
            dist.destroy_process_group()


def load_entries(options: BenchOptions, rank: int, world: int, device, dtype, group, compiled: bool) -> tuple:
    """One sharded model per (source, layout), with its Generator and communicators (``real``, and ``none``
    for the ceiling unless ``options.ceiling`` is off), measured in turn; and each one's all-reduces per decode
    step, counted on ``real`` (``comm_count.py``)."""
    entries, reduces = [], []
    for source, layout in measurements(options, world):
        preset_overrides = {} if is_saved_model(source) else layout_overrides(options.overrides, layout, world)
        comms = {"real": None}
        if group is not None:
            link = (options.link_latency_ms, options.link_bandwidth_gbs)
            comms["real"] = make_communicator(comm_mode_for(layout), group, *link)
            if options.ceiling:
                comms["none"] = TPCommunicator("none", group)
        model = load_tp_model(
            source, rank, world, device, dtype, seed=options.seed, group=group, comm=comms["real"], **preset_overrides
        )
        reduces.append(all_reduces_per_decode_step(model, comms["real"], group))  # before gen allocates its cache
        gen = Generator(
            model, group, compile=compiled, backend=options.compile_backend, gemv_tuning=options.gemv_tuning
        )
        entries.append((source, layout, model, gen, comms))
    return entries, reduces


def measure_batch(options: BenchOptions, entries: list, batch: int, device, group) -> dict:
    """The timed generations of one batch size: (entry index, comm name) -> samples of the measured runs."""
    torch.manual_seed(options.seed)
    prompt = torch.randint(0, entries[0][2].args.vocab_size, (batch, options.prompt_len), device=device)
    samples = {}
    # round robin: every run index measures every layout and comm mode back to back, so slow drifts
    # of a shared machine hit all of them alike
    tokens = {}
    for run in range(options.warmup + options.runs):
        for index, (source, layout, model, gen, comms) in enumerate(entries):
            for comm_name, comm in comms.items():
                if comm is not None:
                    model.set_communicator(comm)
                before = graph_events()
                sample_, tokens[index, comm_name] = time_generation(gen, prompt, options.gen_len, group)
                if run >= options.warmup:
                    if graph_events() != before:  # the run timed a compilation or a CUDA graph's recording
                        raise RuntimeError(
                            f"ladder-bench: timed run {run - options.warmup + 1} of {source} ({layout}, comm {comm_name}, "
                            f"batch {batch}) compiled or recorded a graph: the warm-up did not cover it"
                        )
                    samples.setdefault((index, comm_name), []).append(sample_)
    check_tokens_agree(tokens, group)
    if options.profile:  # one more, untimed generation of each case under the profiler
        trace_generations(
            options.profile, entries, batch, device, lambda gen: time_generation(gen, prompt, options.gen_len, group)
        )
    for *_, gen, _ in entries:  # every model's cache lives through the batch size's runs (round robin)
        gen.release()
    return samples


def batch_rows(
    options: BenchOptions, entries: list, reduces: list[int], batch: int, samples: dict, device, dtype
) -> list[dict]:
    """One result row per entry for this batch size: medians, the ceiling, the all-reduces per decode step,
    module times, weight reads."""
    rows = []
    for index, (source, layout, model, _, comms) in enumerate(entries):
        row = {"model": source, "shape": shape_name(model.args), "layout": layout, "batch": batch}
        row["model_args"] = dataclasses.asdict(model.args)
        row.update(prompt_len=options.prompt_len, gen_len=options.gen_len, runs=options.runs, warmup=options.warmup)
        row.update(summarize(samples[(index, "real")], batch, options.gen_len))
        if "none" in comms:
            row["none"] = summarize(samples[(index, "none")], batch, options.gen_len)
        row["all_reduces_per_decode_step"] = reduces[index]
        row["module_ms"] = module_times_ms(model, batch, options.prompt_len, device, dtype)
        # every decode step reads all of this rank's weights once (the tied head reads the embedding)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        row["weight_bytes_per_rank"] = weight_bytes
        row["decode_weight_read_gb_s"] = weight_bytes / row["decode_ms_per_token"] / 1e6
        rows.append(row)
    return rows


def allow_recompiles(cases: int):
    """The Generators share their step functions' code, on which dynamo counts recompilations: allow one
    graph per (model, communicator, batch size)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), cases))


def graph_events() -> tuple[int, int]:
    """(frames dynamo compiled, CUDA graph recordings) so far: a timed run adds to neither. A recording is seen
    in cudagraph trees' count of the non-static inputs it recorded, which every step has (its tokens)."""
    from torch._dynamo.utils import counters

    return compilations(), counters["inductor"]["cudagraph_recorded_non_static_inputs"]


def compilations() -> int:
    """Frames dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def check_tokens_agree(tokens: dict, group):
    """Greedy decoding skips the token broadcast: check (outside the timed runs) that every rank generated
    the same tokens with real communication, as replicated logits promise."""
    if group is None:
        return
    for (index, comm_name), local in tokens.items():
        if comm_name == "none":  # the ceiling's logits differ per rank on purpose
            continue
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, local, group=group)
        if not all(torch.equal(t, gathered[0]) for t in gathered):
            raise RuntimeError(f"ladder-bench: TP ranks generated different tokens for model {index}")


def _spawned_rank(rank: int, options: BenchOptions, world: int, port: int, launcher: int):
    end_with_parent(os.getppid(), signal.SIGTERM)  # the fork server, which ends when ladder-bench does
    end_with_parent(launcher, signal.SIGTERM)  # a killed ladder-bench takes its ranks with it
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_RANK"] = str(rank)
    run_rank(options)


def run_benchmark(options: BenchOptions) -> int:
    """The benchmark on every rank: under torchrun this process is one of them; else ``options.tp`` ranks are
    spawned here (none for TP = 1). Every bad input fails before a process starts."""
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or ("WORLD_SIZE" in os.environ and "RANK" in os.environ)
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if options.tp not in (None, world):
            raise OptionError(
                "{tp} {given} differs from the torchrun world size {world}", given=options.tp, world=world
            )
        measurements(options, world)
        run_rank(options)
        return 0
    tp = options.tp or 1
    measurements(options, tp)
    if tp == 1:
        run_rank(options)
        return 0
    import multiprocessing

    import torch.multiprocessing as mp

    # the ranks are forked by a fork server that imported this module once: a spawned rank imports torch and the
    # inference code itself, seconds of CPU per rank
    multiprocessing.set_forkserver_preload([__name__])
    args = (options, tp, free_port(), os.getpid())
    mp.start_processes(_spawned_rank, args=args, nprocs=tp, join=True, start_method="forkserver")
    return 0
