"""A performance model of tensor-parallel generation: what ``ladder-predict`` computes.

Every figure it gives is a PREDICTION, not a measurement. Three parts:

- **Costs.** Each module's time on one rank is a roofline over its kernels: max(FLOPs / (peak x compute
  efficiency), bytes / (bandwidth x memory efficiency)) plus a fixed cost per kernel (launch, or eager op
  dispatch on the CPU). Bytes are the weights, the KV cache and the activations the kernel reads and writes.
  An all-reduce is an alpha-beta model of the link: ring, one-shot, or two-level across nodes.
- **Timeline.** A step is simulated as the ops of ``Block.forward`` in ``model/transformer.py``, in order:
  compute, ``reduce`` (issue an all-reduce) and ``wait``. Compute runs on one stream; all-reduces share one
  serialised link per TP group: issued at t, one starts at max(t, end of the previous one) and takes its
  modelled time; ``wait`` blocks compute until it has ended. While an all-reduce is on the wire, compute
  runs at (1 - interference) speed: NCCL's kernels hold SMs, gloo's threads hold the CPU cores the ranks
  compute on. Nothing about overlap is a formula: the ladder's exposed last all-reduce, two all-reduces in
  flight and the prefill all come out of the simulation. A desync layout (``desync-K``) issues only the
  all-reduces ``ModelArgs.layer_reduces`` names, each synchronous as standard's (desync is built on the standard
  layout: nothing is overlapped), and computes what standard computes.

Model shapes (presets, the paper's Llama sizes, a ``config.json``) are in ``shapes.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InputError
from ..model import PAPER_LAYOUTS
from ..model.tp_sharding import check_tp_degree, local_kv_heads
from .hardware import Device, Link
from .shapes import Shape

# ------------------------------------------------------------------------------------------------- costs


def comm_parts(link: Link, nbytes: float, tp: int) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``tp`` ranks on ``link``."""
    if tp == 1:
        return 0.0
    ring = link.alpha_s + 2 * (tp - 1) / tp * nbytes / link.busbw
    if link.algorithm == "ring":
        return ring
    one_shot = link.alpha_s + (tp - 1) * nbytes / (link.link_bw or link.busbw)
    return one_shot if link.algorithm == "one_shot" else min(ring, one_shot)


def allreduce_s(link: Link, nbytes: float, tp: int, device: Device) -> float:
    """One all-reduce; across nodes a two-level one: reduce-scatter in the node, all-reduce of each GPU's
    1/g slice between nodes, all-gather in the node (the two intra-node halves make one intra all-reduce)."""
    g = device.gpus_per_node
    if tp <= g:
        return comm_parts(link, nbytes, tp)
    if device.inter_node is None or tp % g:
        raise InputError(
            f"{device.name}: TP {tp} spans nodes but the profile has no inter_node link (or {g} does not divide it)"
        )
    inter = device.links[device.inter_node]
    return comm_parts(link, nbytes, g) + comm_parts(inter, nbytes / g, tp // g)


@dataclass(frozen=True)
class Kernel:
    flops: float
    bytes: float


def roofline_s(kernels: list[Kernel], device: Device, fixed: bool = True) -> float:
    """Seconds of a sequence of kernels: each bound by compute or by memory, plus its fixed cost."""
    total = 0.0
    for k in kernels:
        total += max(k.flops / (device.peak_flops * device.compute_eff), k.bytes / (device.mem_bw * device.mem_eff))
        total += device.kernel_s if fixed else 0.0
    return total


def module_times(kernels: dict[str, list[Kernel]], device: Device) -> dict[str, float]:
    """Compute seconds of each module: its roofline plus the fixed costs, counted per kernel or, where the
    profile measured them, per module."""
    if not device.overheads:
        return {name: roofline_s(ks, device) for name, ks in kernels.items()}
    o = device.overheads
    fixed = {"attention": o["attention"], "mlp": o["mlp"], "parallel": o["attention"] + o["mlp"], "embed": 0.0}
    fixed["head"] = o["step"]
    return {name: roofline_s(ks, device, fixed=False) + fixed[name] for name, ks in kernels.items()}


def _gemm(tokens: int, k: int, n: int, b: int) -> Kernel:
    return Kernel(2.0 * tokens * k * n, b * (k * n + tokens * (k + n)))


def _elementwise(nbytes: float, count: int = 1) -> list[Kernel]:
    return [Kernel(0.0, nbytes / count)] * count


# eager PyTorch ops per piece beyond the GEMMs (norm: float, pow, mean, add, rsqrt, mul, to, mul; rope on q
# and k: slice, neg, cat, mul, mul, add, to each; the cache write, mask and views): dispatch costs on the CPU
EAGER_OPS = {"norm": 8, "rope": 14, "attn_misc": 12, "mlp_misc": 2, "add": 1}
# fused by torch.compile: one kernel each
FUSED_OPS = {"norm": 1, "rope": 1, "attn_misc": 2, "mlp_misc": 1, "add": 1}


def module_kernels(
    shape: Shape, device: Device, tp: int, batch: int, q_len: int, kv_len: int
) -> dict[str, list[Kernel]]:
    """The kernels of one rank for each module of one forward: ``attention`` and ``mlp`` (each with its
    pre-norm and its residual add), ``embed`` and ``head`` (final norm, replicated LM head over the last
    position, the fp32 cast, the sampling). ``kv_len``: the cache length attention reads."""
    b, d, T = device.dtype_bytes, shape.dim, batch * q_len
    ops = FUSED_OPS if device.compiled else EAGER_OPS
    # above n_kv_heads ranks each rank holds one KV head, replicated (its weights and its cache)
    hd, h, kv = shape.head_dim, shape.n_heads // tp, local_kv_heads(shape.n_kv_heads, tp)
    act = T * d * b

    def fixed(piece: str, nbytes: float) -> list[Kernel]:
        return _elementwise(nbytes, ops[piece])

    norm = fixed("norm", 2 * act)
    add = fixed("add", 3 * act)
    attn = list(norm)
    attn += [_gemm(T, d, h * hd, b), _gemm(T, d, kv * hd, b), _gemm(T, d, kv * hd, b)]
    attn += fixed("rope", 2 * T * (h + kv) * hd * b)
    cache = batch * kv * kv_len * hd * b  # one of k, v
    attn += fixed("attn_misc", 2 * T * kv * hd * b)  # the cache write
    if h > kv:  # repeat_interleave of k and v for grouped-query attention: read the cache, write h heads
        attn.append(Kernel(0.0, 2 * cache + 2 * cache * h // kv))
    read_kv = 2 * cache * h // kv
    attn.append(Kernel(4.0 * batch * h * q_len * kv_len * hd, read_kv + 2 * T * h * hd * b))  # SDPA, mask given
    attn += [_gemm(T, h * hd, d, b)] + add
    mlp = list(norm) + [_gemm(T, d, shape.ffn_dim // tp, b), _gemm(T, d, shape.ffn_dim // tp, b)]
    mlp += fixed("mlp_misc", 3 * T * shape.ffn_dim // tp * b) + [_gemm(T, shape.ffn_dim // tp, d, b)] + add
    parallel = list(norm) + attn[len(norm) :] + mlp[len(norm) :]  # one shared norm, one add of both
    # generation asks for the last position's logits only (``Transformer(..., last_only=True)``)
    logits = batch * shape.vocab_size
    head = fixed("norm", 2 * batch * d * b) + [_gemm(batch, d, shape.vocab_size, b)]
    if b != 4:  # the fp32 cast of the logits (a no-op for an fp32 model)
        head.append(Kernel(0.0, logits * (b + 4)))
    head.append(Kernel(0.0, batch * shape.vocab_size * 4))  # argmax over the last position
    return {"attention": attn, "mlp": mlp, "parallel": parallel, "embed": [Kernel(0.0, 2 * act)], "head": head}


# ---------------------------------------------------------------------------------------------- timeline


def step_ops(
    layouts: list[str], t: dict[str, float], comm: bool = True, reduces: list[tuple[bool, bool]] | None = None
) -> list[tuple]:
    """The op sequence of one forward, as ``Transformer.forward`` and ``Block.forward`` run it.

    ``t`` gives compute seconds for ``embed``, ``attention``, ``mlp``, ``parallel``, ``head``; ops are
    ``("compute", s)``, ``("reduce", key, module)`` and ``("wait", key)``. ``comm=False``: the
    no-communication ceiling (reduce and wait are the identity). ``reduces``: per layer, whether its attention
    and its MLP all-reduce (``ModelArgs.layer_reduces``), read by desync layers only: each module adds its output
    as standard's does, and all-reduces (synchronously) only where it says."""
    ops: list[tuple] = [("compute", t["embed"])]

    def reduce(key, module):
        if comm:
            ops.append(("reduce", key, module))

    def wait(key):
        if comm and key is not None:
            ops.append(("wait", key))

    pending_attn = pending_mlp = None
    for i, layout in enumerate(layouts):
        if layout == "standard":
            ops.append(("compute", t["attention"]))
            reduce(f"a{i}", "attention")
            wait(f"a{i}")
            ops.append(("compute", t["mlp"]))
            reduce(f"m{i}", "mlp")
            wait(f"m{i}")
            pending_attn = pending_mlp = None
        elif layout == "desync":
            for module, key, reduced in zip(("attention", "mlp"), (f"a{i}", f"m{i}"), reduces[i], strict=True):
                ops.append(("compute", t[module]))
                if reduced:
                    reduce(key, module)
                    wait(key)
        elif layout == "parallel":
            ops.append(("compute", t["parallel"]))
            reduce(f"p{i}", "parallel")
            wait(f"p{i}")
            pending_attn = pending_mlp = None
        elif layout != "ladder":  # a layout name (desync-K) is not a layer's layout: Shape.layout_args gives those
            raise ValueError(f"step_ops: layer {i}'s layout {layout!r} is not standard, parallel, ladder or desync")
        else:  # ladder: wait on the previous attention before this attention, the previous MLP before this MLP
            wait(pending_attn)
            ops.append(("compute", t["attention"]))
            reduce(f"a{i}", "attention")
            wait(pending_mlp)
            ops.append(("compute", t["mlp"]))
            reduce(f"m{i}", "mlp")
            pending_attn, pending_mlp = f"a{i}", f"m{i}"
    if pending_attn is not None:  # the last two outputs join before the final norm
        wait(pending_attn)
        wait(pending_mlp)
    ops.append(("compute", t["head"]))
    return ops


def simulate(ops: list[tuple], comm_cost) -> float:
    """End time of ``ops``. ``comm_cost(module)`` gives the all-reduce of that module's output as a list of
    (channel, seconds, interference): each channel is one serialised link (a real one, or an emulated delay
    beside a real gloo exchange), and the all-reduce has ended when all its channels have."""
    t = 0.0
    channel_end: dict[str, float] = {}
    busy: list[tuple[float, float, float]] = []  # (start, end, interference) on any channel
    done: dict[str, float] = {}
    for op in ops:
        kind = op[0]
        if kind == "compute":
            if busy:
                t = _advance(t, op[1], busy)
                busy = [iv for iv in busy if iv[1] > t]
            else:
                t += op[1]
        elif kind == "reduce":  # comparisons, not max(): this loop runs millions of times in a fit
            end = t
            for channel, seconds, interference in comm_cost(op[2]):
                start = channel_end.get(channel, 0.0)
                if start < t:
                    start = t
                stop = channel_end[channel] = start + seconds
                if stop > end:
                    end = stop
                if interference > 0 and seconds > 0:
                    busy.append((start, stop, interference))
            done[op[1]] = end
        else:
            ready = done.pop(op[1])
            if ready > t:
                t = ready
    return t


def _advance(t: float, work: float, busy: list[tuple[float, float, float]]) -> float:
    """Time at which ``work`` seconds of compute started at ``t`` end, slowed where all-reduces run."""
    while work > 1e-18:
        slow, horizon = 0.0, math.inf  # the interference now, and the next time it changes
        for start, end, interference in busy:
            if start <= t < end:
                slow += interference
            if t < start < horizon:
                horizon = start
            if t < end < horizon:
                horizon = end
        rate = 1.0 - slow
        if rate <= 0.0:  # compute stalls until this all-reduce is off the wire
            t = horizon
            continue
        if t + work / rate <= horizon:
            return t + work / rate
        work -= (horizon - t) * rate
        t = horizon
    return t


# -------------------------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Emulated:
    """ladder-bench's emulated link: a serialised delay of X + bytes / B beside the real gloo exchange."""

    latency_s: float
    bandwidth: float | None = None  # bytes/s; None = infinite


def predict_step(
    shape: Shape,
    device: Device,
    link: Link,
    tp: int,
    layout: str,
    batch: int,
    q_len: int,
    kv_len: int,
    emulated: Emulated | None = None,
) -> float:
    """Seconds of one forward of ``batch`` x ``q_len`` tokens over a ``kv_len`` cache; ``layout`` is one
    of PAPER_LAYOUTS, ``desync-K`` (``Shape.layout_args``) or ``none`` (the no-communication ceiling of that
    model's compute, standard's layers)."""
    kernels = module_kernels(shape, device, tp, batch, q_len, kv_len)
    times = module_times(kernels, device)
    act = batch * q_len * shape.dim * device.dtype_bytes
    ops = layout_ops(shape, layout, tp, times)

    # every module's all-reduce moves the same activation: priced once, not at each of the step's all-reduces
    parts = [("link", allreduce_s(link, act, tp, device), link.interference)]
    if emulated is not None:
        bw_s = act / emulated.bandwidth if emulated.bandwidth else 0.0
        parts.append(("emulated", emulated.latency_s + bw_s, 0.0))

    # greedy decoding needs no token broadcast: the all-reduces make the logits equal on every rank
    return simulate(ops, lambda _module: parts)


def layout_ops(shape: Shape, layout: str, tp: int, times: dict[str, float]) -> list[tuple]:
    """The ops of one forward of ``shape`` as ``layout`` at TP ``tp`` (``step_ops``); ``none``: standard's
    layers without communication, as at TP 1."""
    args = shape.layout_args("standard" if layout == "none" else layout, tp)
    return step_ops(args.layer_layouts(), times, tp > 1 and layout != "none", args.layer_reduces())


def all_reduces_per_step(shape: Shape, layout: str, tp: int) -> int:
    """The all-reduces one forward of ``layout`` issues at TP ``tp``: its communication per decode step (one
    token of every sequence), from ``ModelArgs.layer_reduces``."""
    times = dict.fromkeys(("embed", "attention", "mlp", "parallel", "head"), 0.0)
    return sum(op[0] == "reduce" for op in layout_ops(shape, layout, tp, times))


def predict_generation(
    shape: Shape,
    device: Device,
    link: Link,
    tp: int,
    layout: str,
    batch: int,
    prompt_len: int,
    gen_len: int,
    emulated: Emulated | None = None,
) -> dict:
    """Prefill, decode per token and tokens/s of one generation, timed as ladder-bench does: the first
    token comes from the prefill, then gen_len - 1 decode steps; tokens/s = batch x gen_len / total."""
    prefill = predict_step(shape, device, link, tp, layout, batch, prompt_len, prompt_len, emulated)
    if device.compiled:  # the static-shape step attends over the whole masked cache
        decode = predict_step(shape, device, link, tp, layout, batch, 1, prompt_len + gen_len, emulated)
    else:  # eager: the cache up to the current position; the cost is linear in it, so take the mean step
        decode = predict_step(shape, device, link, tp, layout, batch, 1, prompt_len + gen_len // 2, emulated)
    total = prefill + (gen_len - 1) * decode
    return {"prefill_ms": 1e3 * prefill, "decode_ms_per_token": 1e3 * decode, "tokens_per_s": batch * gen_len / total}


def predict_rows(
    shape: Shape,
    device: Device,
    link_name: str,
    tp: int,
    batches: list[int],
    prompt_len: int,
    gen_len: int,
    emulated: Emulated | None = None,
    layouts=PAPER_LAYOUTS,
) -> list[dict]:
    """One row per (batch, layout) plus the ``none`` ceiling, with speedups against standard and the all-reduces
    per decode step."""
    check_tp_degree(shape.args, tp, shape.name)  # the TP loader's rule: KV heads split or replicated evenly
    if link_name not in device.links:
        raise InputError(f"profile {device.name}: no link {link_name!r} (has {', '.join(device.links)})")
    link = device.links[link_name]
    rows = []
    for batch in batches:
        results = {
            lay: predict_generation(shape, device, link, tp, lay, batch, prompt_len, gen_len, emulated)
            for lay in ("standard", *[x for x in layouts if x != "standard"], "none")
        }
        std, none = results["standard"], results["none"]
        for lay, r in results.items():
            row = dict(model=shape.name, gpu=device.name, link=link_name, tp=tp, batch=batch, layout=lay)
            row.update(prompt_len=prompt_len, gen_len=gen_len, **r)
            row["all_reduces_per_decode_step"] = all_reduces_per_step(shape, lay, tp)
            row["speedup_vs_standard"] = r["tokens_per_s"] / std["tokens_per_s"]
            row["decode_speedup_vs_standard"] = std["decode_ms_per_token"] / r["decode_ms_per_token"]
            row["comm_share"] = 1 - none["decode_ms_per_token"] / std["decode_ms_per_token"]
            if emulated is not None:
                row["emulated_link_latency_ms"] = 1e3 * emulated.latency_s
                row["link_bandwidth_gbs"] = emulated.bandwidth / 1e9 if emulated.bandwidth else None
            row["prediction"] = True
            rows.append(row)
    return rows
