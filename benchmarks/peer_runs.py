"""What the peers' parts of gpu_check run, each in its own process (benchmarks/peers.py says what and why):

    python -m benchmarks.peer_runs titan --config recipes/standard_1b.yaml [KEY=VALUE ...] --dump DIR
    python -m benchmarks.peer_runs bare --config recipes/standard_1b.yaml [KEY=VALUE ...] --out FILE
    python -m benchmarks.peer_runs hf-decode --preset 1.2B --layers 40 [--prompt 512 --new 256] --work DIR --out FILE

``titan`` prints the SETUP line, then torchtitan's own log; ``bare`` and ``hf-decode`` write one JSON object to
``--out``. The KEY=VALUE overrides are the trainer's (gpu_check passes those of its training row), so each part
reads the recipe's shape and batch from the same config. torchtitan and transformers are imported only here.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.peers import SETUP
from ladder_train.config import load_config, model_args
from ladder_train.files import write_text
from ladder_train.gpu_cards import peak_flops_for
from ladder_train.model import ModelArgs, build_on_meta, flops_per_token, preset_args
from ladder_train.parallel import (
    BatchSplit,
    build_mesh,
    free_port,
    init_distributed,
    init_sharded_weights,
    parallelize,
    resolve_degrees,
    resolve_dtype,
)
from ladder_train.train.memory_plan import unsharded_fits
from ladder_train.train.optim import build_optimizer, freeze_lower_layers

TITAN_SPEC, TITAN_FLAVOR = "ladder_train_peer", "recipe"  # the train spec and flavour registered with torchtitan


# --- torchtitan's configuration, from our recipe ------------------------------------------------------------------


def titan_ffn(dim: int, multiple_of: int, multiplier: float | None) -> int:
    """torchtitan's SwiGLU width (its Llama's FeedForward): 2/3 of 4 x dim, times the multiplier, rounded up to a
    multiple of ``multiple_of``."""
    hidden = int(2 * (4 * dim) / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


def titan_width(dim: int, ffn_dim: int) -> dict:
    """The ``multiple_of`` (largest first) and ``ffn_dim_multiplier`` with which torchtitan's rule gives ``ffn_dim``."""
    for multiple_of in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if titan_ffn(dim, multiple_of, None) == ffn_dim:
            return {"multiple_of": multiple_of, "ffn_dim_multiplier": None}
    ratio = ffn_dim / int(2 * (4 * dim) / 3)
    for multiplier in (ratio, math.nextafter(ratio, math.inf)):
        if titan_ffn(dim, 1, multiplier) == ffn_dim:
            return {"multiple_of": 1, "ffn_dim_multiplier": multiplier}
    raise ValueError(f"torchtitan's SwiGLU rule reaches no width {ffn_dim} at dim {dim}")


def titan_model(args: ModelArgs) -> dict:
    """torchtitan's ``TransformerModelArgs`` fields for our shape (``rope_scaling_factor``: its RoPEScalingArgs)."""
    if set(args.layer_layouts()) != {"standard"} or args.rope_scaling:
        raise ValueError("torchtitan's Llama computes the standard layout with plain RoPE only")
    return {
        "dim": args.dim,
        "n_layers": args.n_layers,
        "n_heads": args.n_heads,
        "n_kv_heads": args.n_kv_heads,
        "vocab_size": args.vocab_size,
        **titan_width(args.dim, args.ffn_dim),
        "norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "max_seq_len": args.max_seq_len,
        "rope_scaling_factor": 1.0,  # its Llama-3.1 frequency scaling by 1: plain RoPE, as ours
    }


def titan_flags(cfg, dtype: torch.dtype, dump: str) -> list[str]:
    """torchtitan's command line (its JobConfig) for the recipe's training: batch, sequence, steps, AdamW, dtype,
    compile and activation checkpointing; a log line every step, no checkpoint, no colours."""
    train, opt = cfg.train, cfg.train.optimizer
    ac = {"none": "none", "full": "full", "selective": "selective"}.get(cfg.parallel.activation_checkpoint)
    if ac is None:
        raise ValueError(f"torchtitan has no parallel.activation_checkpoint={cfg.parallel.activation_checkpoint}")
    flags = {
        "model.name": TITAN_SPEC,
        "model.flavor": TITAN_FLAVOR,
        "training.local_batch_size": train.micro_batch_size,
        "training.global_batch_size": train.global_batch_size,
        "training.seq_len": cfg.data.seq_len,
        "training.steps": train.max_steps,
        "training.max_norm": opt.grad_clip or math.inf,
        "training.mixed_precision_param": "bfloat16" if dtype == torch.bfloat16 else "float32",
        "optimizer.lr": opt.lr,
        "optimizer.beta1": opt.betas[0],
        "optimizer.beta2": opt.betas[1],
        "optimizer.eps": opt.eps,
        "optimizer.weight_decay": opt.weight_decay,
        "lr_scheduler.warmup_steps": max(1, train.schedule.warmup_steps or 1),
        "activation_checkpoint.mode": ac,
        "metrics.log_freq": 1,
        "job.dump_folder": dump,
    }
    argv = [x for key, value in flags.items() for x in (f"--{key}", str(value))] + ["--metrics.disable_color_printing"]
    return argv + (["--compile.enable", "--compile.components", "model,loss"] if cfg.parallel.compile else [])


class SyntheticBatches:
    """``count`` micro-batches of uniform random tokens drawn once and cycled: (inputs, labels), or for torchtitan
    ({"input": inputs}, labels). Its (empty) state_dict makes it a loader torchtitan's trainer can hold."""

    def __init__(self, vocab: int, micro: int, seq: int, count: int, device="cpu", titan: bool = False):
        tokens = torch.randint(0, vocab, (count, micro, seq + 1), generator=torch.Generator().manual_seed(0))
        self.batches = [(t[:, :-1].contiguous().to(device), t[:, 1:].contiguous().to(device)) for t in tokens]
        self.titan = titan

    def __iter__(self):
        for inputs, labels in itertools.cycle(self.batches):
            yield ({"input": inputs}, labels) if self.titan else (inputs, labels)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def run_titan(cfg, dump: str) -> None:
    """torchtitan's own entry point in this process, on its Llama's train spec with the recipe's shape as a flavour
    and synthetic batches as its loader; first the SETUP line (our FLOPs per token, the card's peak)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    flags = titan_flags(cfg, resolve_dtype(cfg.train.dtype, torch.device(device)), dump)
    sys.argv = [sys.argv[0], *flags]  # before the import: ConfigManager.parse_args's default is sys.argv[1:] then
    from torchtitan import train as titan_train
    from torchtitan.models import llama3
    from torchtitan.models.llama3.model.args import RoPEScalingArgs
    from torchtitan.protocols.train_spec import register_train_spec

    ours = model_args(cfg.model)
    shape = titan_model(ours)
    factor = shape.pop("rope_scaling_factor")
    titan_args = llama3.TransformerModelArgs(**shape, rope_scaling_args=RoPEScalingArgs(scaling_factor=factor))
    micro, seq = cfg.train.micro_batch_size, cfg.data.seq_len
    accumulation = cfg.train.global_batch_size // micro

    def loader(**_):
        return SyntheticBatches(ours.vocab_size, micro, seq, 2 * accumulation, titan=True)

    spec = dataclasses.replace(
        llama3.get_train_spec(),
        model_args={TITAN_FLAVOR: titan_args},
        build_tokenizer_fn=None,
        build_dataloader_fn=loader,
    )
    register_train_spec(TITAN_SPEC, spec)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    setup = {"flops_per_token": flops_per_token(ours, seq), "peak_flops": peak_flops_for(name), "device_name": name}
    setup.update(model_args=titan_model(ours), tie_embeddings=False, flags=flags)
    print(SETUP + json.dumps(setup), flush=True)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    titan_train.main(titan_train.Trainer)


# --- the bare loop ------------------------------------------------------------------------------------------------


def bare_loop(cfg, steps: int) -> dict:
    """Our model built, wrapped and initialised as the trainer does, trained ``steps`` steps on synthetic batches
    held on the device: each step's wall time (synchronized), the plan's accumulation, the peak memory."""
    device, args = init_distributed().device, model_args(cfg.model)
    split = BatchSplit(cfg.train.global_batch_size, cfg.train.micro_batch_size, 1, cfg.data.seq_len)
    model = build_on_meta(args)
    freeze_lower_layers(model, cfg.train.freeze_layers)
    mesh = build_mesh(device.type, *resolve_degrees(cfg.parallel, 1, 1))
    fits = functools.partial(unsharded_fits, cfg, args, split, device)
    model, plan = parallelize(model, cfg.parallel, mesh, resolve_dtype(cfg.train.dtype, device), fits)
    model.to_empty(device=device)
    init_sharded_weights(model, cfg.run.seed)
    optimizer = build_optimizer(model, cfg.train.optimizer)
    batches = iter(SyntheticBatches(args.vocab_size, split.micro_batch, split.seq_len, 2 * split.accumulation, device))
    n, max_norm, times = split.accumulation, cfg.train.optimizer.grad_clip or math.inf, []
    for _ in range(steps):
        start = time.perf_counter()
        for micro in range(n):
            plan.before(micro, n)
            inputs, labels = next(batches)
            (model(inputs, labels=labels) / split.tokens_per_step).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "step_times_s": times,
        "tokens_per_step": split.tokens_per_step,
        "accumulate": plan.accumulate,
        "flops_per_token": flops_per_token(args, split.seq_len, cfg.train.freeze_layers),
        "peak_flops": peak_flops_for(name),
        "device_name": name,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }


# --- transformers' decode -----------------------------------------------------------------------------------------


def hf_decode(opts: argparse.Namespace) -> dict:
    """TPOT of transformers' LlamaForCausalLM on our export of the preset (see the module's doc)."""
    import transformers
    from transformers import LlamaForCausalLM

    from ladder_train.model import Transformer
    from ladder_train.model.hf_format import save_export

    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = {key: value for key, value in (("n_layers", opts.layers), ("vocab_size", opts.vocab)) if value}
    args = preset_args(opts.preset, residual="standard", **shape)
    torch.manual_seed(0)
    with torch.device(device):
        ours = Transformer(args)  # its init_weights draws every weight
    folder = save_export(ours, Path(opts.work) / "export", torch.bfloat16)
    del ours
    model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device).eval()
    model.generation_config.eos_token_id = None  # random weights: every run generates all its tokens
    prompt = torch.randint(0, args.vocab_size, (1, opts.prompt), generator=torch.Generator().manual_seed(0))
    settings = {"do_sample": False, "cache_implementation": "static", "max_cache_len": opts.prompt + opts.new}
    settings.update(hf_compile_settings(device, opts.compile))
    timed = functools.partial(generate_ms, model, prompt.to(device), settings)
    for _ in range(opts.warmup):
        timed(opts.new), timed(1)
    full, short = zip(*((timed(opts.new), timed(1)) for _ in range(opts.runs)), strict=True)
    return {
        "peer": "transformers",
        "peer_version": transformers.__version__,
        "model_args": dataclasses.asdict(args),
        "n_layers": args.n_layers,
        "batch": 1,
        "prompt_len": opts.prompt,
        "gen_len": opts.new,
        "generate_ms": list(full),
        "generate_one_ms": list(short),
        "tpot_ms": tpot_ms(full, short, opts.new),
        "prefill_ms": statistics.median(short),
        "compiled": hasattr(model, "_compiled_call"),  # generate compiled the decode step (get_compiled_call)
        "attn_implementation": model.config._attn_implementation,
        "settings": {k: v for k, v in settings.items() if k != "compile_config"},
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def hf_compile_settings(device: torch.device, compile: bool) -> dict:
    """generate compiles the decode step by itself on a GPU with a static cache; on the CPU only when told to (the
    CompileConfig flag transformers' own CPU tests set); ``compile=False``: never."""
    if not compile:
        return {"disable_compile": True}
    if device.type == "cuda":
        return {}
    from transformers import CompileConfig

    config = CompileConfig(mode="default")
    config._compile_all_devices = True
    return {"compile_config": config}


def generate_ms(model, prompt: torch.Tensor, settings: dict, new: int) -> float:
    sync = torch.cuda.synchronize if prompt.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=new, **settings)
    sync()
    elapsed = (time.perf_counter() - start) * 1e3
    if out.shape[1] != prompt.shape[1] + new:
        raise RuntimeError(f"generate made {out.shape[1] - prompt.shape[1]} tokens, not {new}")
    return elapsed


def tpot_ms(full_ms, one_ms, new: int) -> float:
    """Time per output token: the median generate of ``new`` tokens less the median of 1 (prefill and the first
    token, which the first forward gives), over the other ``new`` - 1."""
    return (statistics.median(full_ms) - statistics.median(one_ms)) / (new - 1)


# --- the command --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_runs", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="run", required=True)
    for name in ("titan", "bare"):
        run = sub.add_parser(name)
        run.add_argument("--config", required=True, help="the recipe of the training row")
        run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="the training row's overrides")
    sub.choices["titan"].add_argument("--dump", required=True, help="torchtitan's job.dump_folder")
    sub.choices["bare"].add_argument("--out", type=Path, required=True, help="the JSON object's file")
    decode = sub.add_parser("hf-decode")
    decode.add_argument("--preset", default="1.2B")
    decode.add_argument("--layers", type=int, default=None, help="n_layers (default: the preset's)")
    decode.add_argument("--vocab", type=int, default=None, help="vocab_size (default: the preset's)")
    decode.add_argument("--prompt", type=int, default=512)
    decode.add_argument("--new", type=int, default=256)
    decode.add_argument("--warmup", type=int, default=2)
    decode.add_argument("--runs", type=int, default=5)
    decode.add_argument("--no-compile", dest="compile", action="store_false", help="eager decode (a CPU check)")
    decode.add_argument("--device", default=None, help="default: cuda where available, else cpu")
    decode.add_argument("--work", type=Path, required=True, help="where the export is written")
    decode.add_argument("--out", type=Path, required=True, help="the JSON object's file")
    args = p.parse_args(argv)
    if args.run == "hf-decode" and (args.new < 2 or min(args.prompt, args.runs) < 1):
        p.error("--new at least 2, --prompt and --runs at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.run == "hf-decode":
        row = hf_decode(args)
    else:
        cfg = load_config(args.config, args.overrides)
        if not cfg.train.max_steps:
            raise SystemExit("peer_runs: set train.max_steps (the steps to run)")
        if args.run == "titan":
            run_titan(cfg, args.dump)
            return 0
        row = bare_loop(cfg, cfg.train.max_steps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
