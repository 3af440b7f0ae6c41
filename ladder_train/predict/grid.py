"""``ladder-predict``'s grid: PREDICTED prefill time, decode time per token and tokens/s of the standard,
parallel and ladder layouts and of the no-communication ceiling under tensor parallelism, for every model, profile,
link and TP degree asked, from the performance model (``perfmodel.py``) and a hardware profile (``hardware.yaml``).
Nothing here is measured. Its flags: ``cli/predict.py``."""

from __future__ import annotations

import argparse

from ..errors import InputError
from ..model.transformer import RESIDUAL_LAYOUTS
from .hardware import load_profiles
from .perfmodel import Emulated, predict_rows
from .shapes import resolve_shape


def emulated_link(opts: argparse.Namespace, link: str) -> Emulated | None:
    if link != "emulated":
        if opts.link_latency_ms is not None or opts.link_bandwidth_gbs is not None:
            raise InputError("--link-latency-ms / --link-bandwidth-gbs need --link emulated")
        return None
    if opts.link_latency_ms is None or opts.link_latency_ms < 0:
        raise InputError("--link emulated needs --link-latency-ms X >= 0 (ladder-bench's emulated latency)")
    if opts.link_bandwidth_gbs is not None and opts.link_bandwidth_gbs <= 0:
        raise InputError(f"--link-bandwidth-gbs must be positive, got {opts.link_bandwidth_gbs}")
    bandwidth = opts.link_bandwidth_gbs * 1e9 if opts.link_bandwidth_gbs else None
    return Emulated(opts.link_latency_ms / 1e3, bandwidth)


def real_link(device, link: str) -> str:
    """The profile's link an emulated one rides on (ladder-bench still runs the real gloo exchange)."""
    if link != "emulated":
        return link
    return "gloo" if "gloo" in device.links else next(iter(device.links))


def prediction_grid(opts: argparse.Namespace) -> list[tuple]:
    """Every (shape, device, link, tp, emulated link) to predict; all input is checked here, before any work.

    ``opts`` are ``cli/predict.py``'s flags, parsed: ``models``, ``gpus``, ``links`` (None: each profile's
    first) and ``layouts`` lists of names, ``tps`` and ``batch_sizes`` positive integers, ``overrides`` the
    ModelArgs fields of ``--set``."""
    devices = load_profiles(opts.profile)
    layouts = opts.layouts
    bad = [v for v in layouts if v not in RESIDUAL_LAYOUTS]
    if bad or not layouts:
        raise InputError(f"--layouts {','.join(layouts)!r}: each must be one of {', '.join(RESIDUAL_LAYOUTS)}")
    if opts.prompt_len < 1 or opts.gen_len < 2:
        raise InputError("need --prompt-len >= 1 and --gen-len >= 2")
    jobs = []
    for gpu in opts.gpus:
        if gpu not in devices:
            raise InputError(f"--gpu {gpu!r}: no such profile (have {', '.join(devices)})")
        device = devices[gpu]
        for link in opts.links or [next(iter(device.links))]:
            emulated = emulated_link(opts, link)
            if real_link(device, link) not in device.links:
                raise InputError(f"--link {link!r}: profile {gpu} has {', '.join(device.links)} (or emulated)")
            for model in opts.models:
                shape = resolve_shape(model, opts.ladder_layers, opts.overrides)
                for tp in opts.tps:
                    jobs.append((shape, device, link, tp, emulated))
    return jobs


def prediction_rows(opts: argparse.Namespace) -> list[dict]:
    """One predicted row per point of the grid, batch size and layout (and the ceiling)."""
    rows = []
    for shape, device, link, tp, emulated in prediction_grid(opts):
        for row in predict_rows(
            shape, device, real_link(device, link), tp, opts.batch_sizes, opts.prompt_len, opts.gen_len, emulated,
            opts.layouts,
        ):  # fmt: skip
            row["link"] = link
            rows.append(row)
    return rows


def print_table(rows: list[dict]):
    print(
        "\nladder-predict: PREDICTED by a performance model (hardware profile + roofline + simulated timeline),"
        " not measured"
    )
    w = max(len("model"), *(len(r["model"]) for r in rows)) + 2
    head = (
        f"{'model':<{w}}{'gpu':<6}{'link':<9}{'tp':>3}{'batch':>6} {'layout':<9}{'prefill ms':>11}"
        f"{'decode ms/tok':>14}{'tok/s':>10}{'speedup':>9}{'decode sp':>10}{'comm share':>11}"
    )
    print(head + "\n" + "-" * len(head))
    for r in rows:
        print(
            f"{r['model']:<{w}}{r['gpu']:<6}{r['link']:<9}{r['tp']:>3}{r['batch']:>6} {r['layout']:<9}"
            f"{r['prefill_ms']:>11.1f}{r['decode_ms_per_token']:>14.3f}{r['tokens_per_s']:>10.1f}"
            f"{r['speedup_vs_standard']:>8.3f}x{r['decode_speedup_vs_standard']:>9.3f}x{r['comm_share']:>11.1%}"
        )
    print(
        "speedup: tokens/s (prefill + decode) over standard's; decode sp: of the decode step; none: every all-reduce"
        " skipped (the ceiling); comm share: 1 - t(none)/t(standard), decode step"
    )


def plot(rows: list[dict], path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = {}
    for r in rows:
        if r["layout"] != "standard":
            key = (r["model"], r["gpu"], r["link"], r["tp"], r["layout"])
            groups.setdefault(key, []).append((r["batch"], r["speedup_vs_standard"]))
    for (model, gpu, link, tp, layout), points in groups.items():
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot(
            xs,
            ys,
            marker="o",
            linestyle="--" if layout == "none" else "-",
            label=f"{layout} - {model}, {gpu} {link}, TP {tp}",
        )
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in rows})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s over standard")
    ax.set_title("PREDICTED speedup over standard (ladder-predict, a model, not a measurement)", fontsize=9)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
