"""The rows of ladder-bench's results: one JSON object per case and batch size, appended as a line to a JSON lines
file (``--out``). ladder-bench writes them; ladder-predict ``--compare`` and ladder-report read them back.

``FIELDS`` names every field a row may hold and what it means; ``read_bench`` and ``write_rows`` are the file's
one reader and writer. Times are milliseconds, the medians over the timed runs unless a field says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError
from .files import open_to_write

# a distribution over the timed runs (bench/results.py ``distribution``): p50, p90, p99, mean, sd, samples
_DISTRIBUTION = "{p50, p90, p99, mean, sd (null for one run), samples (in run order)}"
FIELDS = {
    # the case
    "model": "the --model source: a preset name, an export folder or a training checkpoint",
    "shape": "L{n_layers}-d{dim}-h{n_heads}-f{ffn_dim}-v{vocab_size} (shape_name)",
    "model_args": "every ModelArgs field of the model measured",
    "layout": "residual layout: standard, parallel, ladder, or desync-K (every K-th module all-reduces; desync: a "
    "saved model's own pattern; its fields in model_args)",
    "batch": "sequences generated at once",
    "prompt_len": "prompt tokens per sequence",
    "gen_len": "new tokens per sequence (the first from the prefill)",
    "runs": "timed runs per case",
    "warmup": "untimed runs before them",
    # the measurement
    "prefill_ms": "the prefill, which gives the first token",
    "decode_ms_per_token": "one decode step",
    "tokens_per_s": "batch x gen_len / the whole generation's time (prefill included)",
    "ttft_ms": f"time to first token: {_DISTRIBUTION}",
    "tpot_ms": f"time per output token after it: {_DISTRIBUTION}",
    "tokens_per_s_runs": f"tokens_per_s per run: {_DISTRIBUTION}",
    "all_reduces_per_decode_step": "reduce calls on the communicator in one decode step, counted (0 at TP 1)",
    "none": "the same figures with every all-reduce skipped (the no-communication ceiling), unless --no-ceiling",
    "module_ms": "{attention, mlp}: one decode step's compute of layer 0's modules on one rank",
    "weight_bytes_per_rank": "bytes of one rank's weights",
    "decode_weight_read_gb_s": "weight_bytes_per_rank / decode_ms_per_token, in GB/s",
    "peak_memory_gib": "peak memory of the batch size's runs",
    "peak_memory_of": "what peak_memory_gib measures (CUDA allocated, or the process's peak RSS on the CPU)",
    # derived within one invocation, against the standard row of the same shape and batch (bench/results.py)
    "speedup_vs_standard": "tokens_per_s over standard's (the paper's speedup)",
    "decode_speedup_vs_standard": "standard's decode_ms_per_token over this row's",
    "ceiling_decode_speedup_vs_standard": "standard's decode_ms_per_token over this row's without communication",
    "comm_share": "1 - standard's decode time without communication / with it",
    "overlap_efficiency": "the ladder's (t(standard) - t) / min(t(standard) - t(none, standard), t(none, standard))",
    # the setting, equal for every row of one invocation
    "device": "the GPU's name, or cpu (N cores)",
    "host": "the machine's network name",
    "cpu_model": "the processor's name",
    "torch": "torch's version",
    "nccl": "NCCL's version on a GPU, else null",
    "backend": "nccl or gloo",
    "env": "the NCCL, CUDA and OpenMP environment variables that were set",
    "tp": "tensor-parallel degree",
    "dtype": "the weights' dtype",
    "compiled": "whether the steps ran compiled (CUDA graphs on a GPU)",
    "compile_backend": "torch.compile's backend, or null",
    "gemv_tuning": "compiled decode on a GPU: matrix-vector products as tuned Triton reductions; null elsewhere",
    "compilations": "frames compiled over the invocation (compiled runs only)",
    "emulated_link_latency_ms": "X: the emulated link holds every all-reduce this long (0: the real link)",
    "link_bandwidth_gbs": "the emulated link's bandwidth in GB/s, or null (infinite)",
    "link": "emulated serialised, gloo or nccl",
    "date": "the day of the invocation",
    "started": "when the invocation started (UTC, ISO 8601)",
    "invocation": "an id no other invocation shares: the rows of one invocation are told apart by it",
}
WHERE = "_where"  # added by read_bench, never written: FILE:LINE of the row, for messages


def shape_name(args) -> str:
    """The ``shape`` field of a model's ModelArgs."""
    return f"L{args.n_layers}-d{args.dim}-h{args.n_heads}-f{args.ffn_dim}-v{args.vocab_size}"


def _number(value) -> bool:  # NaN and infinities never reach here: the reader refuses them as it parses
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# what a value must be, where a row has it (null: not measured): the words of the rule and its test
RULES = {
    "positive": ("a positive number", lambda v: _number(v) and v > 0),
    "non-negative": ("a number >= 0", lambda v: _number(v) and v >= 0),
    "number": ("a number", _number),
    "count": ("a positive integer", lambda v: _integer(v) and v > 0),
    "non-negative count": ("an integer >= 0", lambda v: _integer(v) and v >= 0),
    "text": ("a string", lambda v: isinstance(v, str)),
    "flag": ("true or false", lambda v: isinstance(v, bool)),
    "object": ("an object", lambda v: isinstance(v, dict)),
    "samples": ("a list of positive numbers", lambda v: isinstance(v, list) and all(_number(x) and x > 0 for x in v)),
}
# a distribution over the timed runs (bench/results.py ``distribution``), field by field; an object's fields are
# checked as a mapping of them says
DISTRIBUTION = {key: "positive" for key in ("p50", "p90", "p99", "mean")} | {"sd": "non-negative", "samples": "samples"}
_MEASURED = {key: "positive" for key in ("prefill_ms", "decode_ms_per_token", "tokens_per_s")}
_MEASURED |= {key: DISTRIBUTION for key in ("ttft_ms", "tpot_ms", "tokens_per_s_runs")}
# what every figure of a ladder-bench row a reader computes with or prints must be (FIELDS says what each means)
BENCH_ROW = {
    **_MEASURED,
    "none": _MEASURED,
    **{key: "count" for key in ("batch", "prompt_len", "gen_len", "tp", "runs")},
    **{key: "non-negative count" for key in ("warmup", "all_reduces_per_decode_step", "compilations")},
    **{key: "text" for key in ("model", "shape", "layout", "device", "dtype", "link")},
    "model_args": "object",
    "module_ms": {"attention": "non-negative", "mlp": "non-negative"},
    **{key: "positive" for key in ("weight_bytes_per_rank", "decode_weight_read_gb_s", "link_bandwidth_gbs")},
    **{key: "positive" for key in ("speedup_vs_standard", "decode_speedup_vs_standard")},
    "ceiling_decode_speedup_vs_standard": "positive",
    **{key: "number" for key in ("comm_share", "overlap_efficiency")},
    **{key: "non-negative" for key in ("peak_memory_gib", "emulated_link_latency_ms")},
    **{key: "flag" for key in ("compiled", "gemv_tuning")},
}


def check_fields(row: dict, where: str, kinds: dict, prefix: str = "") -> None:
    """Each field of ``kinds`` in ``row`` what its kind (``RULES``, or a mapping: an object whose fields are checked
    the same way) says, where the row has it (null: not measured); else an InputError of one line
    ``where: key=value: must be ...``."""
    for key, kind in kinds.items():
        value = row.get(key)
        if value is None:
            continue
        rule, test = RULES["object"] if isinstance(kind, dict) else RULES[kind]
        if not test(value):
            raise InputError(f"{where}: {prefix}{key}={value!r:.60}: must be {rule}")
        if isinstance(kind, dict):
            check_fields(value, where, kind, f"{prefix}{key}.")


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a number JSON allows")


def read_bench(path: str | Path, need: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a JSON lines file of ladder-bench's (or benchmarks/gpu_check.py's) rows, each with ``WHERE``
    (``FILE:LINE``) for messages. A missing file, a line that is not a JSON object (NaN and infinities are not JSON),
    a row without one of the keys ``need`` (or null there), or a ladder-bench row (one without ``kind``) whose figure
    is not a positive number (``check_fields``) is an InputError of one line naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"benchmark results {path}: no such file")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line, parse_constant=_not_json)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: not a JSON line ({err.msg})") from None
        except ValueError as err:
            raise InputError(f"{where}: not a JSON line ({err})") from None
        if not isinstance(row, dict):
            raise InputError(f"{where}: not a JSON object (a {type(row).__name__}: {line.strip():.40})")
        missing = [key for key in need if row.get(key) is None]
        if missing:
            raise InputError(f"{where}: missing key {missing[0]!r} or null (not a ladder-bench row?)")
        if "kind" not in row:  # a ladder-bench row; gpu_check's rows are checked by the kind that reads them
            check_fields(row, where, BENCH_ROW)
        row[WHERE] = where
        rows.append(row)
    return rows


def write_rows(rows: list[dict], path: str | Path) -> None:
    """Append ``rows`` to a JSON lines file (its folder made if needed)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open_to_write(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
