"""ladder-bench's rows told apart by the invocation that appended them (``invocation``, else ``started``, and where
neither is recorded by a case that repeats): per case one sample per invocation, and the table cells and notes that
show their spread (the median, with the lowest and highest in brackets)."""

from __future__ import annotations

from collections.abc import Callable

from .tables import spread

LAYOUT_ORDER = {"standard": 0, "parallel": 1, "ladder": 2}


def case_key(row: dict) -> tuple:
    """What one invocation measures once: model, layout, batch and the link."""
    return (
        row["model"],
        row.get("shape"),
        row["layout"],
        row["batch"],
        row.get("emulated_link_latency_ms") or 0.0,
        row.get("link_bandwidth_gbs"),
        row.get("tp"),
        row.get("prompt_len"),
        row.get("gen_len"),
    )


def invocations(rows: list[dict]) -> list[list[dict]]:
    """The rows split into the invocations that appended them, in file order."""
    groups: list[list[dict]] = []
    seen: set[tuple] = set()
    for row in rows:
        new_start = bool(groups) and _run_id(row) != _run_id(groups[-1][0])
        if not groups or new_start or case_key(row) in seen:
            groups.append([])
            seen = set()
        groups[-1].append(row)
        seen.add(case_key(row))
    return groups


def _run_id(row: dict) -> str | None:
    return row.get("invocation") or row.get("started")


def samples(rows: list[dict]) -> dict[tuple, list[tuple[dict, dict]]]:
    """Per case (in the order of first appearance, standard first within a link setting), its (row, the standard row
    of the same invocation, shape, batch and link) pairs, one per invocation."""
    found: dict[tuple, list[tuple[dict, dict]]] = {}
    for group in invocations(rows):
        standard = {case_key(r)[:2] + case_key(r)[3:]: r for r in group if r["layout"] == "standard"}
        for row in group:
            key = case_key(row)
            found.setdefault(key, []).append((row, standard.get(key[:2] + key[3:])))
    order = list(found)
    return dict(
        sorted(
            found.items(),
            key=lambda kv: (kv[0][4], kv[0][1], kv[0][3], LAYOUT_ORDER.get(kv[0][2], 9), order.index(kv[0])),
        )
    )


def cell(pairs: list[tuple[dict, dict]], figure: Callable[[dict, dict], float | None], spec: str, suffix="") -> str:
    """The spread of ``figure(row, standard)`` over the invocations that have it; "—" where none has."""
    values = [v for row, standard in pairs if (v := figure(row, standard)) is not None]
    return spread(values, spec, suffix) if values else "—"


def joined_values(rows: list[dict], key: str) -> str:
    """The values of ``key`` over the rows, "/"-joined."""
    return "/".join(sorted({str(row.get(key)) for row in rows}))


def machines(rows: list[dict]) -> str:
    return "; ".join(sorted({f"{r.get('cpu_model', '?')}, {r['device']}" for r in rows}))


def runs_note(rows: list[dict], path: str) -> str:
    """How many invocations of how many runs, the setting, when and where, and the file."""
    groups = invocations(rows)
    per_case = "/".join(map(str, sorted({len(pairs) for pairs in samples(rows).values()})))
    spread_of = (
        f"{len(groups)} invocations: per case the median over its {per_case} (lowest–highest in brackets)"
        if len(groups) > 1
        else "One invocation, no spread"
    )
    compiled = "/".join(sorted({"compiled" if r["compiled"] else "eager" for r in rows}))
    return (
        f"{spread_of}; each invocation's figure is the median of its {joined_values(rows, 'runs')} measured runs after "
        f"{joined_values(rows, 'warmup')} warm-up. TP {joined_values(rows, 'tp')} over {joined_values(rows, 'backend')}, "
        f"{joined_values(rows, 'dtype')}, {compiled}, prompt {joined_values(rows, 'prompt_len')}, {joined_values(rows, 'gen_len')} new "
        f"tokens. Measured {joined_values(rows, 'date')} on {machines(rows)}, torch {joined_values(rows, 'torch')}; rows in "
        f"`{path}`."
    )
