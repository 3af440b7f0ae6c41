"""Hardware profiles for ``ladder-predict``: read and check ``hardware.yaml`` (shipped) or a user's file.

A profile names a device's peak compute (``peak_tflops``, or ``card``: a card of ``gpu_cards.py``'s table, the
dense bf16 peaks by GPU card that the trainer's MFU reads too) and memory bandwidth, the efficiencies
assumed for them, a fixed cost per kernel, the dtype, and its links. Any key it does not know, any missing
key, any value that is not a positive number is refused with one line naming the file, the profile and the key.

A profile and each of its links may say where each of its constants comes from: ``origin: {KEY: "KIND: where
from"}`` with KIND one of ``ORIGIN_KINDS`` (a public specification, a measurement, fitted to data, or assumed).
The loader checks it (a known KIND, a KEY the entry has) and the prediction never reads it; every constant
of the shipped file has one (``ORIGIN_NEEDED``; ``origins`` lists them).

A loaded profile is a ``Device`` with its ``Link``s: the figures ``perfmodel.py`` prices kernels and all-reduces
with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from ..errors import InputError
from ..gpu_cards import CARDS
from ..option_errors import OptionError

SHIPPED = "hardware.yaml"


@dataclass(frozen=True)
class Link:
    """One interconnect. ``alpha_s``: fixed time of one all-reduce (small-message latency); ``busbw``:
    nccl-tests' bus bandwidth (bytes/s), so a ring takes alpha + 2(p-1)/p x bytes / busbw; ``link_bw``:
    per-GPU unidirectional bandwidth for one-shot (each rank reads the p-1 others: alpha + (p-1) x bytes /
    link_bw); ``interference``: the fraction of compute speed lost while an all-reduce is on the wire."""

    name: str
    alpha_s: float
    busbw: float
    algorithm: str = "ring"
    link_bw: float | None = None
    interference: float = 0.0


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # per rank, in the benchmark's dtype
    mem_bw: float  # bytes/s per rank
    compute_eff: float
    mem_eff: float
    kernel_s: float  # fixed cost per kernel (launch under CUDA graphs, op dispatch in eager PyTorch)
    dtype_bytes: int
    compiled: bool  # fused kernels and a static cache read whole (CUDA graphs), else eager ops
    links: dict[str, Link] = field(default_factory=dict)
    gpus_per_node: int = 8
    inter_node: str | None = None  # the link between nodes when tp > gpus_per_node
    # measured fixed costs (eager CPU): seconds per attention block, per MLP block and per step (embedding,
    # head, sampling, the Python loop); when given they replace kernel_s x the kernel count
    overheads: dict[str, float] | None = None
    card: str | None = None  # the GPU card of gpu_cards.py the profile names (``card:``): rows of it are its rows


# key -> (required, kind); kind "pos" = positive number, "frac" = in [0, 1], "bool", "str", "int"
DEVICE_KEYS = {
    "description": (False, "str"),
    "card": (False, "str"),
    "peak_tflops": (False, "pos"),  # exactly one of card / peak_tflops
    "mem_bw_gbs": (True, "pos"),
    "compute_eff": (True, "frac"),
    "mem_eff": (True, "frac"),
    "kernel_us": (True, "nonneg"),
    "dtype_bytes": (True, "int"),
    "compiled": (True, "bool"),
    "gpus_per_node": (False, "int"),
    "inter_node": (False, "str"),
    "links": (True, "map"),
    "attention_overhead_us": (False, "nonneg"),
    "mlp_overhead_us": (False, "nonneg"),
    "step_overhead_us": (False, "nonneg"),
    "calibrated": (False, "str"),
    "origin": (False, "origin"),
}
LINK_KEYS = {
    "alpha_us": (True, "nonneg"),
    "busbw_gbs": (True, "pos"),
    "algorithm": (False, "str"),
    "link_gbs": (False, "pos"),
    "interference": (False, "frac"),
    "description": (False, "str"),
    "origin": (False, "origin"),
}
ALGORITHMS = ("ring", "one_shot", "auto")
# what an origin may say: a public specification (which), a measurement (what, where), fitted (to what data), or
# assumed (no data behind the value: what it rests on)
ORIGIN_KINDS = ("spec", "measured", "fitted", "assumed")
# the constants that must say their origin in the shipped file (the rest are settings: dtype, compiled, names)
ORIGIN_NEEDED = {
    "device": (
        "peak_tflops",
        "mem_bw_gbs",
        "compute_eff",
        "mem_eff",
        "kernel_us",
        "attention_overhead_us",
        "mlp_overhead_us",
        "step_overhead_us",
    ),
    "link": ("alpha_us", "busbw_gbs", "link_gbs", "interference"),
}


def _check(value, kind: str, where: str):
    ok = {
        "pos": isinstance(value, int | float) and not isinstance(value, bool) and value > 0,
        "nonneg": isinstance(value, int | float) and not isinstance(value, bool) and value >= 0,
        "frac": isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1,
        "int": isinstance(value, int) and not isinstance(value, bool) and value > 0,
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "map": isinstance(value, dict) and bool(value),
        "origin": isinstance(value, dict),
    }[kind]
    if not ok:
        need = {
            "pos": "a positive number",
            "nonneg": "a number >= 0",
            "frac": "a number in [0, 1]",
            "int": "a positive integer",
            "bool": "true or false",
            "str": "a string",
            "map": "a non-empty mapping",
            "origin": "a mapping of this entry's keys to where each comes from",
        }
        raise InputError(f"{where} must be {need[kind]}, got {value!r}")


def _keys(entry, spec: dict, where: str):
    if not isinstance(entry, dict):
        raise InputError(f"{where}: must be a mapping, got {type(entry).__name__}")
    for key in entry:
        if key not in spec:
            raise InputError(f"{where}.{key}: unknown key (known: {', '.join(spec)})")
    for key, (required, kind) in spec.items():
        if key in entry:
            _check(entry[key], kind, f"{where}.{key}")
        elif required:
            raise InputError(f"{where}.{key}: missing")
    for key, text in entry.get("origin", {}).items():
        if key not in entry or key == "origin":
            raise InputError(f"{where}.origin.{key}: names no constant of this entry (it has {', '.join(entry)})")
        if not isinstance(text, str) or ":" not in text or text.split(":", 1)[0] not in ORIGIN_KINDS:
            kinds = ", ".join(ORIGIN_KINDS)
            raise InputError(f"{where}.origin.{key} must be 'KIND: where from', KIND one of {kinds}; got {text!r}")


def _shipped_data() -> dict:
    data = yaml.safe_load(resources.files("ladder_train.predict").joinpath(SHIPPED).read_text())
    return data if isinstance(data, dict) else {}


def _peak_flops(entry: dict, where: str) -> float:
    if ("card" in entry) == ("peak_tflops" in entry):
        raise InputError(f"{where}.peak_tflops: give either peak_tflops or card (a card of gpu_cards.py's table)")
    if "peak_tflops" in entry:
        return entry["peak_tflops"] * 1e12
    if entry["card"] not in CARDS:
        raise InputError(f"{where}.card: unknown card {entry['card']!r} (known: {', '.join(CARDS)})")
    return CARDS[entry["card"]].peak_flops


def parse_profiles(data, origin: str) -> dict[str, Device]:
    """Devices by name from a loaded YAML mapping; ``origin`` (the file) starts every error."""
    if not isinstance(data, dict) or not data:
        raise InputError(f"{origin}: expected a mapping of profile names to profiles")
    devices = {}
    for name, entry in data.items():
        where = f"{origin}: {name}"
        _keys(entry, DEVICE_KEYS, where)
        peak = _peak_flops(entry, where)
        links = {}
        for link_name, link in entry["links"].items():
            lwhere = f"{where}.links.{link_name}"
            _keys(link, LINK_KEYS, lwhere)
            algorithm = link.get("algorithm", "ring")
            if algorithm not in ALGORITHMS:
                raise InputError(f"{lwhere}.algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
            links[link_name] = Link(
                link_name,
                link["alpha_us"] * 1e-6,
                link["busbw_gbs"] * 1e9,
                algorithm,
                link["link_gbs"] * 1e9 if "link_gbs" in link else None,
                link.get("interference", 0.0),
            )
        inter = entry.get("inter_node")
        if inter is not None and inter not in links:
            raise InputError(f"{where}.inter_node: {inter!r} is not one of its links ({', '.join(links)})")
        devices[name] = Device(
            name,
            peak,
            entry["mem_bw_gbs"] * 1e9,
            entry["compute_eff"],
            entry["mem_eff"],
            entry["kernel_us"] * 1e-6,
            entry["dtype_bytes"],
            entry["compiled"],
            links,
            entry.get("gpus_per_node", 8),
            inter,
            _overheads(entry, where),
            entry.get("card"),
        )
    return devices


def _overheads(entry: dict, where: str) -> dict[str, float] | None:
    keys = ("attention_overhead_us", "mlp_overhead_us", "step_overhead_us")
    given = [k for k in keys if k in entry]
    if not given:
        return None
    if len(given) != len(keys):
        missing = next(k for k in keys if k not in entry)
        raise InputError(f"{where}.{missing}: missing (the three *_overhead_us keys go together)")
    return {k.removesuffix("_overhead_us"): entry[k] * 1e-6 for k in keys}


def load_profiles(path: str | Path | None = None) -> dict[str, Device]:
    """The shipped profiles, with those of ``path`` (a user's file) added or replacing same-named ones."""
    devices = parse_profiles(_shipped_data(), SHIPPED)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise OptionError("{profile} {path}: no such file", path=path)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise InputError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
        devices.update(parse_profiles(data, str(path)))
    return devices


def origins(path: str | Path | None = None) -> dict[str, dict[str, str]]:
    """Where each constant of each profile comes from, as its ``origin`` entries say: profile -> {``KEY`` or
    ``links.LINK.KEY``: "KIND: where from"}; the shipped file's, or ``path``'s (already checked by loading it)."""
    if path is None:
        data = _shipped_data()
    else:
        load_profiles(path)
        data = yaml.safe_load(Path(path).read_text())
    found = {}
    for name, entry in data.items():
        found[name] = dict(entry.get("origin", {}))
        for link_name, link in entry["links"].items():
            found[name].update({f"links.{link_name}.{k}": v for k, v in link.get("origin", {}).items()})
    return found
