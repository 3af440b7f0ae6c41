"""``ladder-bench``: tokens/s of the standard, parallel and ladder layouts under tensor parallelism.

    ladder-bench --model 1.2B --tp 2 --layouts standard,parallel,ladder --batch-sizes 1,4,16,64
    torchrun --nproc-per-node 8 -m ladder_train.inference.bench --model 3.5B-32h --out results.jsonl

Without torchrun, ``--tp N`` spawns its N ranks itself (gloo on the CPU, one thread each). For every
layout and batch size it measures a greedy generation (prefill + decode) with the real all-reduces and
again with every all-reduce skipped (the no-communication ceiling), after warm-up runs, and reports
medians over the measured runs: the speedup over standard in the paper's terms (end-to-end tokens/s,
batch x new tokens / wall time, prefill included) and, beside it, the decode-step speedup; the
communication share 1 - t(none)/t(standard) and the overlap efficiency
(t(standard) - t(layout)) / min(t(standard) - t(none), t(none)) of the decode step (docs/benchmarks.md).

``--link-latency-ms X [--link-bandwidth-gbs B]`` emulates a slow interconnect as one serialised link per
TP group, as one NCCL stream is: an all-reduce issued at t starts at max(t, end of the previous one) and
occupies the link X ms + bytes / B; its wait returns no earlier than that end. Eager runs only (host
sleeps), so it needs ``--compile off``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..checkpoint import verify_checkpoint
from ..errors import InputError
from ..loading import load_tp_model, resolve_source
from ..model import RESIDUAL_LAYOUTS, ModelArgs
from ..model.tp_plan import check_tp_degree
from ..parallel import free_port
from .bench_results import derive, print_table
from .generate import Generator
from .tp import TPCommunicator, comm_mode_for, make_communicator

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


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ladder-bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="preset name, export folder or training checkpoint (RUN_DIR/checkpoints/step-N); several, comma-separated",
    )
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="ModelArgs overrides of a preset")
    p.add_argument("--layouts", default="standard,parallel,ladder", help="for presets; a saved model has its own")
    p.add_argument("--batch-sizes", default="1,4,16,64")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--gen-len", type=int, default=512)
    p.add_argument("--tp", type=int, default=None, help="TP degree; under torchrun the world size")
    p.add_argument(
        "--link-latency-ms",
        type=float,
        default=0.0,
        help="emulated link: each all-reduce occupies one serialised link for X ms (+ bytes / bandwidth), "
        "starting when issued and the previous one has finished",
    )
    p.add_argument(
        "--link-bandwidth-gbs", type=float, default=None, help="emulated link bandwidth in GB/s (default: infinite)"
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto", help="auto: on with CUDA")
    p.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend (inductor; aot_eager compiles faster)"
    )
    p.add_argument("--no-ceiling", action="store_true", help="skip the comm: none measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON lines results file (appended)")
    return p.parse_args(argv)


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} must list positive integers, got {text!r}")
    return values


def _overrides(items: list[str]) -> dict:
    fields = {f.name: f.type for f in dataclasses.fields(ModelArgs)}
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise InputError(f"--set {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(fields)}")
        out[key] = float(value) if key in ("rope_theta", "norm_eps", "init_std") else int(value)
    return out


def plan(opts: argparse.Namespace, tp: int) -> list[tuple[str, str]]:
    """(model source, layout) pairs to measure; validates everything before any process starts."""
    layouts = [v for v in opts.layouts.split(",") if v]
    bad = [v for v in layouts if v not in RESIDUAL_LAYOUTS]
    if bad or not layouts:
        raise InputError(f"--layouts {opts.layouts!r}: each must be one of {', '.join(RESIDUAL_LAYOUTS)}")
    _int_list("--batch-sizes", opts.batch_sizes)
    if opts.gen_len < 2 or opts.prompt_len < 1 or opts.runs < 1 or opts.warmup < 0:
        raise InputError("need --gen-len >= 2, --prompt-len >= 1, --runs >= 1, --warmup >= 0")
    if opts.link_latency_ms < 0 or (opts.link_bandwidth_gbs is not None and opts.link_bandwidth_gbs <= 0):
        raise InputError("--link-latency-ms must be >= 0 and --link-bandwidth-gbs > 0")
    if opts.compile == "on" and emulated_link(opts):
        raise InputError("the emulated link sleeps on the host and needs --compile off")
    if opts.compile == "on" and opts.warmup < 1:
        raise InputError("--compile on needs --warmup >= 1 (the first run compiles)")
    overrides = _overrides(opts.set)
    pairs = []
    for source in [m for m in opts.model.split(",") if m]:
        try:
            found = resolve_source(source, **(overrides if not _is_saved_model(source) else {}))
            args, kind = found.args, found.kind
            check_tp_degree(args, tp, source)
            if kind == "checkpoint":  # a damaged checkpoint fails here in one line, before any rank starts
                verify_checkpoint(Path(source), no_dist=True)
        except ValueError as err:  # e.g. an unreadable config.json; a damaged checkpoint stays a RunFailed
            raise InputError(str(err)) from None
        if opts.prompt_len + opts.gen_len > args.max_seq_len:
            raise InputError(f"{source}: --prompt-len + --gen-len exceed max_seq_len={args.max_seq_len}")
        pairs += [(source, layout) for layout in layouts] if kind == "preset" else [(source, args.residual)]
    return pairs


def emulated_link(opts: argparse.Namespace) -> bool:
    return bool(opts.link_latency_ms or opts.link_bandwidth_gbs)


def _is_saved_model(source: str) -> bool:
    return os.path.isdir(source)


def environment(device: torch.device, tp: int, opts: argparse.Namespace, compiled: bool, dtype) -> dict:
    nccl = None
    if device.type == "cuda":
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "host": platform.node(),
        "torch": torch.__version__,
        "nccl": nccl,
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "tp": tp,
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": compiled,
        "compile_backend": opts.compile_backend if compiled else None,
        "emulated_link_latency_ms": opts.link_latency_ms,
        "link_bandwidth_gbs": opts.link_bandwidth_gbs,
        "link": "emulated serialised" if emulated_link(opts) else ("gloo" if device.type == "cpu" else "nccl"),
        "date": datetime.date.today().isoformat(),
    }


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_generation(
    gen: Generator, prompt: torch.Tensor, gen_len: int, group
) -> tuple[tuple[float, float, float], torch.Tensor]:
    """One greedy generation: (seconds of prefill, seconds per decode step, total seconds) and the tokens.
    The cache is released afterwards, so models measured in turn never hold their caches at once."""
    device = prompt.device
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
    gen.release()
    if tokens.shape != (prompt.shape[0], gen_len):  # the work that was timed was really done
        raise RuntimeError(
            f"ladder-bench: generated {tuple(tokens.shape)} tokens, expected {(prompt.shape[0], gen_len)}"
        )
    # token 1 comes from the prefill
    return (marks["prefill"] - start, (end - marks["prefill"]) / (gen_len - 1), end - start), tokens


def summarize(samples: list[tuple[float, float, float]], batch: int, gen_len: int) -> dict:
    prefill, decode, total = zip(*samples, strict=True)
    return {
        "prefill_ms": 1e3 * statistics.median(prefill),
        "decode_ms_per_token": 1e3 * statistics.median(decode),
        "tokens_per_s": batch * gen_len / statistics.median(total),
    }


def _kernel_ms(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of ``fn`` after 2 warm-up calls: CUDA events on a GPU (the kernels' own time on
    the stream, not the host's launch time), host timers on the CPU, where the work is synchronous."""
    samples = []
    for _ in range(reps + 2):
        if device.type == "cuda":
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            finish.record()
            finish.synchronize()
            samples.append(begin.elapsed_time(finish))
        else:
            start = time.perf_counter()
            fn()
            samples.append(1e3 * (time.perf_counter() - start))
    return statistics.median(samples[2:])


@torch.no_grad()
def module_times_ms(model, batch: int, pos: int, device, dtype, reps: int = 20) -> dict:
    """One decode step's compute for the attention and the MLP of layer 0 on this rank (no communication)."""
    layer = model.layers[0]
    model.setup_kv_cache(batch, pos + 1)  # attention reads a cache of ``pos`` keys, as in a decode step
    x = torch.randn(batch, 1, model.args.dim, device=device, dtype=dtype)
    cos, sin = model.rope_cos[pos : pos + 1], model.rope_sin[pos : pos + 1]
    out = {
        "attention": _kernel_ms(lambda: layer.attention(x, cos, sin, pos), device, reps),
        "mlp": _kernel_ms(lambda: layer.mlp(x), device, reps),
    }
    model.clear_kv_cache()
    return out


def run_rank(opts: argparse.Namespace):
    """One TP rank (the whole benchmark when TP = 1). Rank 0 prints and writes the results."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1 if world > 1 else torch.get_num_threads())
    dtype = torch.bfloat16 if cuda else torch.float32
    compiled = opts.compile == "on" or (opts.compile == "auto" and cuda and not emulated_link(opts))
    group = None
    if world > 1:
        dist.init_process_group(
            "nccl" if cuda else "gloo", rank=rank, world_size=world, device_id=device if cuda else None
        )
        group = dist.group.WORLD
    env = environment(device, world, opts, compiled, dtype)
    overrides = _overrides(opts.set)
    batch_sizes = _int_list("--batch-sizes", opts.batch_sizes)
    rows = []
    try:
        entries = []  # one sharded model per (source, layout), measured in turn
        for source, layout in plan(opts, world):
            preset_overrides = {} if _is_saved_model(source) else {**overrides, "residual": layout}
            model = load_tp_model(source, rank, world, device, dtype, seed=opts.seed, **preset_overrides)
            comms = {"real": None}
            if group is not None:
                link = (opts.link_latency_ms, opts.link_bandwidth_gbs)
                comms["real"] = make_communicator(comm_mode_for(layout), group, *link)
                if not opts.no_ceiling:
                    comms["none"] = TPCommunicator("none", group)
            gen = Generator(model, group, compile=compiled, backend=opts.compile_backend)
            entries.append((source, layout, model, gen, comms))
        if compiled:
            cases = sum(len(comms) for *_, comms in entries) * len(batch_sizes)
            allow_recompiles(cases)
            compiled_before = compilations()
        for batch in batch_sizes:
            torch.manual_seed(opts.seed)
            prompt = torch.randint(0, entries[0][2].args.vocab_size, (batch, opts.prompt_len), device=device)
            samples = {}
            # round robin: every run index measures every layout and comm mode back to back, so slow drifts
            # of a shared machine hit all of them alike
            tokens = {}
            for run in range(opts.warmup + opts.runs):
                for index, (_, _, model, gen, comms) in enumerate(entries):
                    for comm_name, comm in comms.items():
                        if comm is not None:
                            model.set_communicator(comm)
                        sample_, tokens[index, comm_name] = time_generation(gen, prompt, opts.gen_len, group)
                        if run >= opts.warmup:
                            samples.setdefault((index, comm_name), []).append(sample_)
            check_tokens_agree(tokens, group)
            for index, (source, layout, model, _, comms) in enumerate(entries):
                row = {"model": source, "shape": _shape(model.args), "layout": layout, "batch": batch}
                row["model_args"] = dataclasses.asdict(model.args)
                row.update(prompt_len=opts.prompt_len, gen_len=opts.gen_len, runs=opts.runs, warmup=opts.warmup)
                row.update(summarize(samples[(index, "real")], batch, opts.gen_len))
                if "none" in comms:
                    row["none"] = summarize(samples[(index, "none")], batch, opts.gen_len)
                row["module_ms"] = module_times_ms(model, batch, opts.prompt_len, device, dtype)
                # every decode step reads all of this rank's weights once (the tied head reads the embedding)
                weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
                row["weight_bytes_per_rank"] = weight_bytes
                row["decode_weight_read_gb_s"] = weight_bytes / row["decode_ms_per_token"] / 1e6
                rows.append({**row, **env})
        if compiled:
            # prefill + decode graph per (model, communicator, batch size); more would be a recompile per step
            env["compilations"] = compilations() - compiled_before
            if env["compilations"] > 2 * cases:
                raise RuntimeError(f"ladder-bench: {env['compilations']} compilations for {cases} cases: recompiling")
            rows = [{**row, "compilations": env["compilations"]} for row in rows]
        if rank == 0:
            derive(rows)
            print_table(rows, env)
            if opts.out:
                with open(opts.out, "a") as f:
                    for row in rows:
                        f.write(json.dumps(row) + "\n")
                print(f"results appended to {opts.out}")
    finally:
        if group is not None:
            dist.destroy_process_group()


def allow_recompiles(cases: int):
    """The Generators share their step functions' code, on which dynamo counts recompilations: allow one
    graph per (model, communicator, batch size)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), cases))


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


def _shape(args: ModelArgs) -> str:
    return f"L{args.n_layers}-d{args.dim}-h{args.n_heads}-f{args.ffn_dim}-v{args.vocab_size}"


def _spawned_rank(rank: int, opts: argparse.Namespace, world: int, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_RANK"] = str(rank)
    run_rank(opts)


def run(argv: list[str]) -> int:
    opts = parse_args(argv)
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or ("WORLD_SIZE" in os.environ and "RANK" in os.environ)
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if opts.tp not in (None, world):
            raise InputError(f"--tp {opts.tp} differs from the torchrun world size {world}")
        plan(opts, world)
        run_rank(opts)
        return 0
    tp = opts.tp or 1
    plan(opts, tp)  # every bad input fails here, before a process starts
    if tp == 1:
        run_rank(opts)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_spawned_rank, args=(opts, tp, free_port()), nprocs=tp, join=True)
    return 0


if __name__ == "__main__":
    from ..cli import bench

    sys.exit(bench())
