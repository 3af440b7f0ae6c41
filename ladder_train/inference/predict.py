"""``ladder-predict``: PREDICTED prefill time, decode time per token and tokens/s of the standard, parallel
and ladder layouts and of the no-communication ceiling under tensor parallelism, from a performance model
(``perfmodel.py``) and a hardware profile (``hardware.yaml``). Nothing here is measured.

    ladder-predict --model llama-70b --gpu h100 --link nvlink --tp 8 --batch-sizes 1,4,16,64 \\
        --prompt-len 1024 --gen-len 512 [--out FILE.jsonl] [--plot FILE.png]
    ladder-predict --gpu cpu --link emulated --link-latency-ms 20 --model small --tp 2 ...
    ladder-predict --compare bench.jsonl [--profile cpu.yaml]      # against ladder-bench's measurements
    ladder-predict calibrate --out cpu.yaml                         # measure this machine's `cpu` profile
    ladder-predict validate --out-dir DIR                           # calibrate + ladder-bench runs + --compare
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from ..errors import InputError
from ..model.transformer import RESIDUAL_LAYOUTS
from .hardware import load_profiles
from .perfmodel import Emulated, predict_rows
from .perfshapes import resolve_shape, shape_from_fields

PROG = "ladder-predict"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        default="llama-70b",
        help="preset, llama-1b..llama-405b, or a config.json (file or folder); comma-separated",
    )
    p.add_argument(
        "--gpu",
        default=None,
        help="profile name(s): h100 (default), h200, a100, cpu or one of --profile; with --compare cpu by default",
    )
    p.add_argument(
        "--link",
        default=None,
        help="link(s) of the profile (nvlink, pcie = P2P disabled, gloo, emulated); default: its first",
    )
    p.add_argument(
        "--tp", default="8", help="TP degree(s), comma-separated; above the GPUs of a node the inter-node link joins"
    )
    p.add_argument("--batch-sizes", default="1,4,16,64")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--gen-len", type=int, default=512)
    p.add_argument("--layouts", default="standard,parallel,ladder")
    p.add_argument("--ladder-layers", type=int, default=None, help="hybrid: only the last N layers are ladder")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="FIELD=VALUE", help="shape overrides, as ladder-bench's --set"
    )
    p.add_argument("--profile", default=None, help="a YAML file of profiles, added to (or replacing) the shipped ones")
    p.add_argument("--link-latency-ms", type=float, default=None, help="with --link emulated: ladder-bench's X")
    p.add_argument(
        "--link-bandwidth-gbs", type=float, default=None, help="with --link emulated: its B (default infinite)"
    )
    p.add_argument("--out", default=None, help="JSON lines file (appended)")
    p.add_argument("--plot", default=None, help="PNG of the speedups over standard by batch size")
    p.add_argument(
        "--compare", default=None, metavar="BENCH.jsonl", help="predict ladder-bench rows and report the errors"
    )
    return p.parse_args(argv)


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise InputError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} must list positive integers, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key] = float(value) if "." in value or "e" in value else int(value)
        except ValueError:
            raise InputError(f"--set {item!r}: expected FIELD=NUMBER") from None
        if not sep:
            raise InputError(f"--set {item!r}: expected FIELD=NUMBER")
    return out


def _emulated(opts, link: str) -> Emulated | None:
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


def plan(opts) -> list[tuple]:
    """Every (shape, device, link, tp) to predict; all input is checked here, before any work."""
    devices = load_profiles(opts.profile)
    layouts = _names(opts.layouts)
    bad = [v for v in layouts if v not in RESIDUAL_LAYOUTS]
    if bad or not layouts:
        raise InputError(f"--layouts {opts.layouts!r}: each must be one of {', '.join(RESIDUAL_LAYOUTS)}")
    _ints("--batch-sizes", opts.batch_sizes)
    if opts.prompt_len < 1 or opts.gen_len < 2:
        raise InputError("need --prompt-len >= 1 and --gen-len >= 2")
    jobs = []
    for gpu in _names(opts.gpu):
        if gpu not in devices:
            raise InputError(f"--gpu {gpu!r}: no such profile (have {', '.join(devices)})")
        device = devices[gpu]
        for link in _names(opts.link) if opts.link else [next(iter(device.links))]:
            emulated = _emulated(opts, link)
            if real_link(device, link) not in device.links:
                raise InputError(f"--link {link!r}: profile {gpu} has {', '.join(device.links)} (or emulated)")
            for model in _names(opts.model):
                shape = resolve_shape(model, opts.ladder_layers, _overrides(opts.set))
                for tp in _ints("--tp", opts.tp):
                    jobs.append((shape, device, link, tp, emulated))
    return jobs


def prediction_rows(opts) -> list[dict]:
    rows = []
    batches = _ints("--batch-sizes", opts.batch_sizes)
    layouts = _names(opts.layouts)
    for shape, device, link, tp, emulated in plan(opts):
        for row in predict_rows(
            shape, device, real_link(device, link), tp, batches, opts.prompt_len, opts.gen_len, emulated, layouts
        ):
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


# ------------------------------------------------------------------------------------------------ compare


def read_bench(path: str) -> list[dict]:
    rows = []
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--compare {path}: no such file")
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{n}: not JSON ({err.msg})") from None
        for key in ("layout", "batch", "prompt_len", "gen_len", "decode_ms_per_token", "tp"):
            if key not in row:
                raise InputError(f"{path}:{n}: missing key {key!r} (not a ladder-bench row?)")
        if not isinstance(row.get("model_args"), dict):
            raise InputError(
                f"{path}:{n}: no model_args in the row: rerun ladder-bench with a version that records them"
            )
        row["_where"] = f"{path}:{n}"
        rows.append(row)
    if not rows:
        raise InputError(f"{path}: no rows")
    return rows


def _rel(pred: float | None, meas: float | None) -> float | None:
    return None if pred is None or not meas else pred / meas - 1


def compare(bench: list[dict], device, link: str | None = None) -> tuple[list[dict], dict]:
    """Predict each bench row on ``device`` (its link unless ``link``; emulated where the row was) and the
    relative errors pred / measured - 1. Returns the per-row results and the mean absolute errors."""
    cache: dict[tuple, dict] = {}
    out = []
    # every row's shape and layout is checked before any prediction
    shapes = [
        shape_from_fields(r.get("shape") or r.get("model", "bench"), r["model_args"], True, r["_where"]) for r in bench
    ]
    for row in bench:
        if row["layout"] not in RESIDUAL_LAYOUTS:
            raise InputError(f"{row['_where']}: layout {row['layout']!r} is not one of {', '.join(RESIDUAL_LAYOUTS)}")
    for row, shape in zip(bench, shapes, strict=True):
        x = row.get("emulated_link_latency_ms") or 0.0
        bw = row.get("link_bandwidth_gbs")
        emulated = Emulated(x / 1e3, bw * 1e9 if bw else None) if x or bw else None
        link_name = link or ("gloo" if "gloo" in device.links else next(iter(device.links)))
        # a compiled run fuses kernels and reads the whole static cache, as the profile's `compiled` says
        dev = dataclasses.replace(device, compiled=bool(row.get("compiled", device.compiled)))
        key = (shape, dev.compiled, row["tp"], row["batch"], row["prompt_len"], row["gen_len"], emulated)
        if key not in cache:
            preds = predict_rows(
                shape, dev, link_name, row["tp"], [row["batch"]], row["prompt_len"], row["gen_len"], emulated
            )
            cache[key] = {r["layout"]: r for r in preds}
        pred = cache[key][row["layout"]]
        pred_none = cache[key]["none"]
        meas_sp = row.get("decode_speedup_vs_standard")
        result = {
            "shape": shape.name,
            "layout": row["layout"],
            "batch": row["batch"],
            "x_ms": x,
            "pred_decode_ms": pred["decode_ms_per_token"],
            "meas_decode_ms": row["decode_ms_per_token"],
            "pred_speedup": pred["decode_speedup_vs_standard"],
            "meas_speedup": meas_sp,
            "pred_none_ms": pred_none["decode_ms_per_token"],
            "meas_none_ms": (row.get("none") or {}).get("decode_ms_per_token"),
        }
        result["decode_err"] = _rel(result["pred_decode_ms"], result["meas_decode_ms"])
        result["speedup_err"] = _rel(result["pred_speedup"], meas_sp) if row["layout"] != "standard" else None
        result["none_err"] = _rel(result["pred_none_ms"], result["meas_none_ms"])
        out.append(result)

    def mae(key):
        errs = [abs(r[key]) for r in out if r[key] is not None]
        return statistics.fmean(errs) if errs else None

    return out, {"decode": mae("decode_err"), "speedup": mae("speedup_err"), "none": mae("none_err")}


def print_compare(results: list[dict], summary: dict, path: str, device_name: str):
    def pct(v):
        return f"{v:+.1%}" if v is not None else "-"

    def num(v, spec):
        return format(v, spec) if v is not None else "-"

    print(f"\nladder-predict --compare {path}: PREDICTED ({device_name} profile) vs MEASURED (ladder-bench)")
    head = (
        f"{'shape':<24}{'layout':<9}{'batch':>6}{'X ms':>6} | {'decode ms/tok pred':>18}{'meas':>9}{'err':>8} |"
        f" {'speedup pred':>12}{'meas':>7}{'err':>8} | {'no-comm pred':>12}{'meas':>9}{'err':>8}"
    )
    print(head + "\n" + "-" * len(head))
    for r in results:
        print(
            f"{r['shape'][-24:]:<24}{r['layout']:<9}{r['batch']:>6}{r['x_ms']:>6g} | {r['pred_decode_ms']:>18.2f}"
            f"{r['meas_decode_ms']:>9.2f}{pct(r['decode_err']):>8} | {r['pred_speedup']:>11.2f}x"
            f"{num(r['meas_speedup'], '6.2f'):>6}x{pct(r['speedup_err']):>8} | {r['pred_none_ms']:>12.2f}"
            f"{num(r['meas_none_ms'], '.2f'):>9}{pct(r['none_err']):>8}"
        )
    print(
        "mean absolute error: decode ms/tok "
        + (f"{summary['decode']:.1%}" if summary["decode"] is not None else "-")
        + ", decode speedup (non-standard rows) "
        + (f"{summary['speedup']:.1%}" if summary["speedup"] is not None else "-")
        + ", no-comm ms/tok "
        + (f"{summary['none']:.1%}" if summary["none"] is not None else "-")
    )


def run(argv: list[str]) -> int:
    if argv[:1] == ["calibrate"]:
        from .calibrate import run as calibrate

        return calibrate(argv[1:])
    if argv[:1] == ["validate"]:
        from .predict_validation import run as validate

        return validate(argv[1:])
    opts = parse_args(argv)
    if opts.compare:
        devices = load_profiles(opts.profile)
        gpu = opts.gpu or "cpu"  # ladder-bench rows come from the CPU unless told otherwise
        if gpu not in devices:
            raise InputError(f"--gpu {gpu!r}: no such profile (have {', '.join(devices)})")
        bench = read_bench(opts.compare)
        link = real_link(devices[gpu], opts.link) if opts.link else None
        results, summary = compare(bench, devices[gpu], link)
        print_compare(results, summary, opts.compare, gpu)
        return 0
    opts.gpu = opts.gpu or "h100"
    rows = prediction_rows(opts)
    print_table(rows)
    if opts.out:
        with open(opts.out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"predictions appended to {opts.out}")
    if opts.plot:
        plot(rows, opts.plot)
        print(f"plot written to {opts.plot}")
    return 0


if __name__ == "__main__":
    from ..cli import predict

    sys.exit(predict())
