"""``ladder-predict``'s grid: PREDICTED prefill time, decode time per token, tokens/s and all-reduces per decode
step of the standard, parallel, ladder and desync-K layouts and of the no-communication ceiling under tensor
parallelism, for every model, profile, link and TP degree asked, from the performance model (``perfmodel.py``) and
a hardware profile (``hardware.yaml``). Nothing here is measured. ``cli/predict.py`` builds its options from the
flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import PAPER_LAYOUTS
from ..option_errors import OptionError, check_desync_tp, check_layouts
from .hardware import load_profiles
from .perfmodel import Emulated, predict_rows
from .shapes import resolve_shape


@dataclass(frozen=True)
class PredictOptions:
    """What to predict: ``models`` (presets, ``llama-*`` names or config.json paths), ``gpus`` (profile names),
    ``links`` (a profile's links or ``emulated``; None: each profile's first), ``tps``, ``batch_sizes`` and
    ``layouts`` (``desync-K``: every K-th module all-reduces, built for each TP degree); ``ladder_layers``: a
    hybrid, only the last N layers ladder; ``overrides``: shape fields to replace;
    ``profile``: a YAML file of profiles added to the shipped ones; ``link_latency_ms`` / ``link_bandwidth_gbs``:
    the emulated link's X and B (ladder-bench's)."""

    models: tuple[str, ...] = ("llama-70b",)
    gpus: tuple[str, ...] = ("h100",)
    links: tuple[str, ...] | None = None
    tps: tuple[int, ...] = (8,)
    batch_sizes: tuple[int, ...] = (1, 4, 16, 64)
    prompt_len: int = 1024
    gen_len: int = 512
    layouts: tuple[str, ...] = PAPER_LAYOUTS
    ladder_layers: int | None = None
    overrides: dict = field(default_factory=dict)
    profile: str | None = None
    link_latency_ms: float | None = None
    link_bandwidth_gbs: float | None = None


def emulated_link(options: PredictOptions, link: str) -> Emulated | None:
    latency, bandwidth = options.link_latency_ms, options.link_bandwidth_gbs
    if link != "emulated":
        if latency is not None or bandwidth is not None:
            raise OptionError("{link_latency_ms} / {link_bandwidth_gbs} need {link} emulated")
        return None
    if latency is None or latency < 0:
        raise OptionError("{link} emulated needs {link_latency_ms} X >= 0 (ladder-bench's emulated latency)")
    if bandwidth is not None and bandwidth <= 0:
        raise OptionError("{link_bandwidth_gbs} must be positive, got {given}", given=bandwidth)
    return Emulated(latency / 1e3, bandwidth * 1e9 if bandwidth else None)


def real_link(device, link: str) -> str:
    """The profile's link an emulated one rides on (ladder-bench still runs the real gloo exchange)."""
    if link != "emulated":
        return link
    return "gloo" if "gloo" in device.links else next(iter(device.links))


def prediction_grid(options: PredictOptions) -> list[tuple]:
    """Every (shape, device, link, tp, emulated link) to predict; all input is checked here, before any work."""
    devices = load_profiles(options.profile)
    layouts = options.layouts
    check_layouts(layouts)
    if options.prompt_len < 1 or options.gen_len < 2:
        raise OptionError("need {prompt_len} >= 1 and {gen_len} >= 2")
    jobs = []
    for gpu in options.gpus:
        if gpu not in devices:
            raise OptionError("{gpu} {name!r}: no such profile (have {known})", name=gpu, known=", ".join(devices))
        device = devices[gpu]
        for link in options.links or [next(iter(device.links))]:
            emulated = emulated_link(options, link)
            if real_link(device, link) not in device.links:
                have = ", ".join(device.links)
                raise OptionError(
                    "{link} {name!r}: profile {gpu_name} has {have} (or emulated)", name=link, gpu_name=gpu, have=have
                )
            for model in options.models:
                shape = resolve_shape(model, options.ladder_layers, options.overrides)
                for tp in options.tps:
                    check_desync_tp(layouts, tp)
                    jobs.append((shape, device, link, tp, emulated))
    return jobs


def prediction_rows(options: PredictOptions) -> list[dict]:
    """One predicted row per point of the grid, batch size and layout (and the ceiling)."""
    rows = []
    for shape, device, link, tp, emulated in prediction_grid(options):
        setting = (options.batch_sizes, options.prompt_len, options.gen_len, emulated, options.layouts)
        for row in predict_rows(shape, device, real_link(device, link), tp, *setting):
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
        f"{'decode ms/tok':>14}{'ARs/step':>9}{'tok/s':>10}{'speedup':>9}{'decode sp':>10}{'comm share':>11}"
    )
    print(head + "\n" + "-" * len(head))
    for r in rows:
        print(
            f"{r['model']:<{w}}{r['gpu']:<6}{r['link']:<9}{r['tp']:>3}{r['batch']:>6} {r['layout']:<9}"
            f"{r['prefill_ms']:>11.1f}{r['decode_ms_per_token']:>14.3f}{r['all_reduces_per_decode_step']:>9}"
            f"{r['tokens_per_s']:>10.1f}"
            f"{r['speedup_vs_standard']:>8.3f}x{r['decode_speedup_vs_standard']:>9.3f}x{r['comm_share']:>11.1%}"
        )
    print(
        "ARs/step: all-reduces per decode step; speedup: tokens/s (prefill + decode) over standard's; decode sp: of"
        " the decode step; none: every all-reduce skipped (the ceiling); comm share: 1 - t(none)/t(standard), decode"
        " step"
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
