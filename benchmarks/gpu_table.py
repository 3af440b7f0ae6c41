"""gpu_check's printed table: one line per row (train, big, profile with its top kernels, ceilings, decode; the peers'
lines are ``peers.table_line``), under a head that names the card, driver, torch, date and commit."""

from __future__ import annotations

from benchmarks import peers


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, spec=",.0f") -> str:
    return "-" if x is None else format(x, spec)


def part_label(row: dict) -> str:
    """train, big, or train+ where a variant's overrides changed the run (they follow its figures)."""
    return row["kind"] + ("+" if row.get("variant") else "")


def table(rows: list[dict], env: dict) -> str:
    head = (
        f"gpu_check ({env['mode']}): {env['card'] or 'CPU: ' + env['host']['cpu_model']} | driver "
        f"{env['driver'] or '-'} | torch {env['torch']} (CUDA {env['cuda'] or '-'}) | {env['date']} | commit "
        f"{(env['git_commit'] or '-')[:10]}{' (dirty)' if env['git_dirty'] else ''}"
    )
    columns = f"{'part':<8} {'layout':<9} {'mb':>3}  {'tokens/s median (range)':<27} {'MFU':>6} "
    columns += f"{'peak GiB':>9} {'plan GiB':>9} {'plan err':>8}"
    lines = [head, columns]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['kind']:<8} {r.get('layout', '-'):<9} {r.get('micro_batch', '-')!s:>3}  {r['error']}")
        elif r["kind"] in ("train", "big"):
            tps = f"{_num(r.get('tokens_per_s_median'))} ({_num(r.get('tokens_per_s_min'))}-{_num(r.get('tokens_per_s_max'))})"
            lines.append(
                f"{part_label(r):<8} {r['layout']:<9} {r['micro_batch']:>3}  {tps:<27} {_pct(r.get('mfu_median')):>6} "
                f"{_num(r.get('peak_mem_gib'), '.2f'):>9} {_num(r['plan_total_gib'], '.2f'):>9} {_pct(r['plan_rel_error']):>8}"
                + (f"  {', '.join(r['variant'])}" if r.get("variant") else "")
            )
        elif r["kind"] == "profile":
            busy = (
                f"GPU busy {_pct(r['busy_share'])} of {r['span_ms']:.1f} ms"
                if r.get("busy_share") is not None
                else r.get("note", "")
            )
            per = f"per step: {_num(r['kernels_per_step'])} kernels, {_num(r['copies_per_step'])} copies, "
            per += f"{_num(r['memsets_per_step'])} memsets, {_num(r['runtime_calls_per_step'])} runtime calls"
            host = f"host {_num(r.get('host_step_ms'))} ms a step"
            lines.append(f"profile  {r['layout']:<9} {r['micro_batch']:>3}  {busy}; {host}; {per}")
            lines += [f"{'':<24}{k['ms']:10.2f} ms {k['count']:6d}x  {k['name'][:90]}" for k in r["top_kernels"][:5]]
        elif r["kind"] == "ceilings":
            lines.append(
                f"ceilings copy {r['copy_tb_s_median'] * 1e3:,.0f} GB/s (read + written), bf16 matmul "
                f"{r['matmul']['n']}^3 {r['matmul_tflops_median']:,.1f} TFLOP/s"
            )
        elif r["kind"] == "decode":
            tuned = {True: ", GEMV tuned", False: ", GEMV untuned"}.get(r.get("gemv_tuning"), "")
            lines.append(
                f"decode   {r['layout']:<9} {r['batch']:>3}  TPOT {r['tpot_ms']:.3f} ms ({r['n_layers']} layers{tuned}, "
                f"{r['weight_bytes'] / 1e6:,.1f} MB of weights): {r['bandwidth_gb_s']:,.1f} GB/s"
            )
        elif r["kind"] in peers.KINDS:
            lines.append(peers.table_line(r))
    return "\n".join(lines)
