"""benchmarks/gpu_check.py and its modules: the plan and metrics readers (gpu_rows), the commands it would run on a GPU
(gpu_plan), wheels installed for a bare machine and the commit it records (machine), the parts' process groups killed
(parts), and ``--tiny`` end to end on the CPU as benchmarks/gpu_lease.sh runs it. The trace summary's tests:
tests/test_train_trace_summary.py."""

import gzip
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check as check
from benchmarks import gpu_plan, gpu_rows, machine, parts
from ladder_train.model import PRESETS, ModelArgs, count_params

REPO = Path(__file__).resolve().parents[1]


DRY_RUN = "$ python -m ladder_train.train ... --dry-run --simulate 1x1 --json\n" + json.dumps(
    {"run": "standard_1b", "memory_gib": {"states": 18.0, "sharded": 27.72, "unsharded": 34.22}, "micro_batches": 8}
)


def test_the_plan_totals_and_the_accumulation_the_run_used(tmp_path):
    assert gpu_rows.plan_totals(DRY_RUN) == {"sharded": 27.72, "unsharded": 34.22}
    assert gpu_rows.plan_totals("Traceback ...\nValueError: no") == {}
    assert gpu_rows.plan_totals('{"memory_gib": {"sharded": 1.0}') == {}  # cut short
    run_dir = tmp_path / "run"
    assert gpu_rows.accumulation_of(run_dir) is None  # no summary: the run did not start
    run_dir.mkdir()
    for chosen, read in (("unsharded", "unsharded"), ("sharded", "sharded"), ("none", None)):
        (run_dir / "summary.json").write_text(json.dumps({"finished": False, "step": 0, "fsdp_gradients": chosen}))
        assert gpu_rows.accumulation_of(run_dir) == read
    plan = gpu_rows.plan_totals(DRY_RUN)
    unsharded = gpu_rows.plan_against(plan, "unsharded", 31.0, on_gpu=True)
    assert unsharded["plan_total_gib"] == 34.22 and unsharded["plan_rel_error"] == pytest.approx(3.22 / 31)
    assert gpu_rows.plan_against(plan, None, 28.84, on_gpu=True)["plan_rel_error"] == pytest.approx(
        (27.72 - 28.84) / 28.84
    )
    on_cpu = gpu_rows.plan_against(plan, None, 0.4, on_gpu=False)
    assert on_cpu["plan_total_gib"] == 27.72 and on_cpu["plan_rel_error"] is None and "CPU" in on_cpu["plan_note"]
    assert gpu_rows.plan_against({}, None, 1.0, on_gpu=True)["plan_total_gib"] is None


def test_throughput_after_the_warm_up_steps(tmp_path):
    tps = [100, 500, 300, 400, 200, 600]
    mfu = [0.1, 0.5, None, 0.4, 0.2, 0.3]
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": i + 1, "tokens_per_s": t, "mfu": m, "peak_mem_gib": 20 + i, "step_time_s": 1 / t}
        for i, (t, m) in enumerate(zip(tps, mfu, strict=True))
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"step": 7, "tokens_p')  # a line being written
    assert gpu_rows.reached_step(metrics, 6)() and not gpu_rows.reached_step(metrics, 7)()
    figures = gpu_rows.throughput(gpu_rows.logged_steps(metrics), skip=2)
    assert figures["steps"] == 6 and figures["measured_steps"] == [3, 6]
    assert (figures["tokens_per_s_median"], figures["tokens_per_s_min"], figures["tokens_per_s_max"]) == (350, 200, 600)
    assert figures["mfu_median"] == pytest.approx(0.3)  # of 0.4, 0.2, 0.3 (step 3 has none)
    assert figures["peak_mem_gib"] == 25
    assert gpu_rows.throughput([], skip=2) == {"steps": 0}


def test_decode_bandwidth_from_the_parameter_count(shared_dir):
    path = shared_dir / "gpu" / "2026-11-26" / "bench_tp1_8layers.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    bench = [json.loads(x) for x in path.read_text().splitlines()]
    for b in bench:
        row = gpu_rows.decode_row(b)
        assert row["n_layers"] == 8 and row["params"] == 302_016_000  # 8 blocks and the tied 49,152 x 1,536 embedding
        assert row["weight_bytes"] == 2 * row["params"] == b["weight_bytes_per_rank"]  # bf16
        assert row["bandwidth_gb_s"] == pytest.approx(b["decode_weight_read_gb_s"])
    standard = gpu_rows.decode_row(next(b for b in bench if b["layout"] == "standard"))
    assert standard["tpot_ms"] == pytest.approx(0.596, abs=5e-4) and round(standard["bandwidth_gb_s"]) == 1013


def test_the_commands_a_gpu_run_would_run(tmp_path):
    args = check.parse_args(["--out", str(tmp_path), "--micro", "2,4", "--profile", "--big"])
    plan = gpu_plan.Plan(
        gpu_plan.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T", "data.tokenizer=/K.json"], args
    )
    plans, measured, by_name = gpu_plan.build_parts(plan)
    names = [p.name for p in measured]
    assert names == [
        "ceilings",
        *(f"train-{layout}-mb{mb}" for layout in gpu_plan.LAYOUTS for mb in (2, 4)),
        "profile-standard-mb2",
        "big-ladder-mb1",
        "decode",
        "decode-gemv-off",
    ]
    assert sorted(p.name for p in plans) == sorted(f"plan-{n}" for n in names if n.startswith(("train", "big")))
    ladder4 = measured[names.index("train-ladder-mb4")].argv
    assert ladder4[:5] == [sys.executable, "-m", "ladder_train.train", "--config", "recipes/ladder_1b.yaml"]
    wanted = ["data.source=/T", "data.tokenizer=/K.json", "train.global_batch_size=16", "train.micro_batch_size=4"]
    wanted += ["train.max_steps=20", "parallel.compile=true", "eval.at_end=false", "checkpoint.every=0"]
    wanted += ["wandb.mode=disabled", f"run.dir={tmp_path / 'work' / 'train-ladder-mb4'}"]
    assert set(wanted) <= set(ladder4)
    assert by_name["train-ladder-mb4"].argv == [*ladder4, "--dry-run", "--simulate", "1x1", "--json"]
    profile = measured[names.index("profile-standard-mb2")].argv
    assert {"profile.enabled=true", "profile.wait=5", "profile.warmup=2", "profile.active=3"} <= set(profile)
    assert "train.max_steps=11" in profile
    decode = " ".join(measured[names.index("decode")].argv)
    assert "-m ladder_train.bench --model 1.2B --compile on" in decode and "--set n_layers=8" in decode
    assert "--tp 1" in decode and "--layouts standard,parallel,ladder" in decode and "--gemv-tuning on" in decode
    assert "--gemv-tuning off" in " ".join(measured[names.index("decode-gemv-off")].argv)
    big = measured[names.index("big-ladder-mb1")].argv
    assert big[4] == "recipes/ladder_3b.yaml"
    keys = [x.split("=")[0] for x in big[5:]]
    assert len(keys) == len(set(keys))  # every setting once: the big run's replace the common ones
    assert {"train.global_batch_size=4", "train.micro_batch_size=1", "parallel.compile=false"} <= set(big)
    assert "train.max_steps=4" in big
    for part in measured:
        if "--config" in part.argv:
            assert (REPO / part.argv[part.argv.index("--config") + 1]).is_file()
    # decode of other layouts than training's, or none
    args = check.parse_args(["--out", str(tmp_path), "--decode-layouts", "standard", "--decode-layers", "40"])
    plan = gpu_plan.Plan(gpu_plan.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T"], args)
    decode = gpu_plan.build_parts(plan)[1][-2].argv
    assert decode[decode.index("--layouts") + 1] == "standard" and "n_layers=40" in decode
    args = check.parse_args(["--out", str(tmp_path), "--decode-layers", "0"])
    plan = gpu_plan.Plan(gpu_plan.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T"], args)
    assert [p.name for p in gpu_plan.build_parts(plan)[1]] == ["ceilings"] + [
        f"train-{x}-mb2" for x in gpu_plan.LAYOUTS
    ]
    # --set reaches every training run and plan (a before/after of one setting in two invocations)
    args = check.parse_args(["--out", str(tmp_path), "--set", "parallel.accumulate=sharded"])
    plan = gpu_plan.Plan(gpu_plan.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T"], args)
    _, measured, by_name = gpu_plan.build_parts(plan)
    assert all("parallel.accumulate=sharded" in p.argv for p in measured if p.kind == "train")
    assert all("parallel.accumulate=sharded" in p.argv for p in by_name.values())
    # --variant: each training run again right after it with the variant's overrides; a plan of each
    argv = ["--out", str(tmp_path), "--layouts", "standard", "--variant", "parallel.accumulate=sharded"]
    args = check.parse_args([*argv, "--variant", "parallel.blocks_per_fsdp_unit=4,parallel.accumulate=sharded"])
    plan = gpu_plan.Plan(gpu_plan.GPU, tmp_path / "work", tmp_path / "logs", ["data.source=/T"], args)
    _, measured, by_name = gpu_plan.build_parts(plan)
    trains = [p for p in measured if p.kind == "train"]
    assert [p.name for p in trains] == ["train-standard-mb2", "train-standard-mb2-v1", "train-standard-mb2-v2"]
    assert [p.info["variant"] for p in trains] == [[], *args.variant]
    assert [gpu_rows.last_override(p.argv, "parallel.accumulate") for p in trains] == [None, "sharded", "sharded"]
    assert [gpu_rows.last_override(p.argv, "parallel.blocks_per_fsdp_unit") for p in trains] == [None, None, "4"]
    assert by_name["train-standard-mb2-v2"].argv[:-4] == trains[2].argv
    for bad in (
        ["--micro", "3"],
        ["--layouts", "standard,wide"],
        ["--steps", "5", "--skip", "5"],
        ["--set", "x"],
        ["--variant", "parallel.accumulate"],
        ["--variant", ","],
    ):
        with pytest.raises(check.Refused):  # main says it in one line, exit 2
            check.parse_args(["--out", str(tmp_path), *bad])


def make_wheel(folder: Path) -> Path:
    """A pure-Python wheel as pip reads one: the package, its METADATA, WHEEL and RECORD."""
    folder.mkdir(parents=True)
    wheel = folder / "demo_gpu_pkg-1.0-py3-none-any.whl"
    files = {
        "demo_gpu_pkg/__init__.py": "VALUE = 7\n",
        "demo_gpu_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo-gpu-pkg\nVersion: 1.0\n",
        "demo_gpu_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "demo_gpu_pkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in {**files, "demo_gpu_pkg-1.0.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return wheel


@pytest.mark.slow
def test_wheels_are_installed_by_pip_for_a_machine_that_lacks_the_package(tmp_path, monkeypatch):
    gpu_dir = tmp_path / ".gpu"
    make_wheel(gpu_dir / "whl")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(machine, "NEEDED_MODULES", ("json", "demo_gpu_pkg"))
    site = machine.ensure_imports(gpu_dir)
    assert site == gpu_dir / "site" and str(site) == sys.path[0]
    assert (site / "demo_gpu_pkg" / "__init__.py").read_text() == "VALUE = 7\n"
    assert (site / "demo_gpu_pkg-1.0.dist-info" / "METADATA").is_file()
    assert machine.ensure_imports(gpu_dir) is None  # now importable: nothing to do
    monkeypatch.setattr(machine, "NEEDED_MODULES", ("demo_gpu_pkg_absent",))
    with pytest.raises(SystemExit, match="demo_gpu_pkg_absent.*gpu_prepare.sh"):
        machine.ensure_imports(gpu_dir)
    env = machine.child_env(site, tiny=True)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(REPO), str(site)] and env["CUDA_VISIBLE_DEVICES"] == ""


def test_gpu_check_imports_the_package_only_after_it_installed_what_the_machine_lacks():
    """gpu_check and the modules it imports name no third-party or package module at their top: ensure_imports runs
    first on a bare machine (the package's own imports may come from .gpu/whl)."""
    import ast

    for name in ("gpu_check", "gpu_plan", "gpu_rows", "gpu_table", "machine", "parts", "records", "peers"):
        tree = ast.parse((REPO / "benchmarks" / f"{name}.py").read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        roots = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
        assert roots <= set(sys.stdlib_module_names) | {"__future__", "benchmarks"}, (name, roots)


def test_a_copy_outside_git_records_the_commit_gpu_prepare_wrote(tmp_path, monkeypatch):
    """The GPU machine may receive the tree inside another repository: its rows must name this project's commit."""
    commit_file = tmp_path / "commit"
    monkeypatch.setattr(machine, "COMMIT_FILE", commit_file)
    monkeypatch.setattr(machine, "git", lambda *args: {"rev-parse": "/elsewhere"}.get(args[0]))
    assert machine.project_commit() == (None, None)  # nothing recorded: no commit claimed
    commit_file.write_text("dd36332" + "0" * 33 + " dirty\n")
    assert machine.project_commit() == ("dd36332" + "0" * 33, True)
    answers = {("rev-parse", "--show-toplevel"): str(REPO), ("rev-parse", "HEAD"): "abc123"}
    monkeypatch.setattr(machine, "git", lambda *args: answers.get(args, ""))
    assert machine.project_commit() == ("abc123", False)  # a checkout: git's own answer, .gpu/commit not read


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow
def test_a_part_is_killed_with_its_children_at_its_limit_or_when_its_work_is_in(tmp_path):
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(120)"
    )
    env = machine.child_env(None, tiny=True)
    part = parts.Part("sleeper", "train", [sys.executable, "-c", code], 3, tmp_path / "sleeper.log")
    start = time.monotonic()
    outcome = parts.run_part(part, env)
    assert outcome["timed_out"] and not outcome["stopped"] and outcome["rc"] is None and not parts.part_ok(part)
    assert time.monotonic() - start < 30 and "TIMED OUT" in parts.failure(part)
    parent, child = (int(x) for x in pids.read_text().split())
    deadline = time.monotonic() + 10
    while (alive(parent) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(parent) and not alive(child)

    pids.unlink()
    part = parts.Part("stopped", "train", [sys.executable, "-c", code], 60, tmp_path / "stopped.log", done=pids.exists)
    outcome = parts.run_part(part, env)
    assert outcome["stopped"] and not outcome["timed_out"] and parts.part_ok(part) and outcome["wall_s"] < 30
    parent, child = (int(x) for x in pids.read_text().split())
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def tiny_token_folder(tmp_path: Path) -> Path:
    """A byte-tokenized token folder of 300 made-up documents (~200k tokens), made in this process."""
    from ladder_train.cli.data import run as ladder_data

    words = "the court held that a state law on appeal was void because federal rules apply here".split()
    source = tmp_path / "docs"
    source.mkdir()
    with open(source / "train.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": " ".join(words[(i * 7 + j) % len(words)] for j in range(120))}) + "\n")
    assert ladder_data(["prepare", str(source), str(tmp_path / "tokens"), "--tokenizer", "byte"]) == 0
    return tmp_path / "tokens"


@pytest.mark.slow
def test_tiny_runs_every_part_on_the_cpu_through_the_lease_script(tmp_path):
    """gpu_check --tiny as a device call runs it: benchmarks/gpu_lease.sh check with TINY=1 and its own CHECK."""
    tokens = tiny_token_folder(tmp_path)
    out = tmp_path / "out"
    temp = tmp_path / "temp"  # its own temp dir: another test's gpu_study makes gpu_check_* folders too
    temp.mkdir()
    check_args = f"--tiny --profile --keep-trace --tokens {tokens} --tokenizer byte --skip 2"
    env = {**os.environ, "TMPDIR": str(temp), "TINY": "1", "OUT": str(out), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_lease.sh", "check"],
        cwd=REPO,
        env={**env, "CHECK": check_args},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "gpu.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["ceilings"] + ["train"] * 3 + ["profile"] + ["decode"] * 3
    assert all(r["error"] is None and not r["timed_out"] for r in rows)

    ceilings = rows.pop(0)  # benchmarks/gpu_ceilings.py at the tiny sizes, host-clock timed on the CPU
    assert (ceilings["device"], ceilings["matmul"]["n"], ceilings["copy"]["bytes_read_plus_written"]) == (
        "cpu",
        256,
        2**25,
    )
    assert ceilings["copy_tb_s_median"] == pytest.approx(2**25 / ceilings["copy"]["median_ms"] / 1e9)
    assert ceilings["matmul_tflops_median"] == pytest.approx(2 * 256**3 / ceilings["matmul"]["median_ms"] / 1e9)
    assert "ceilings copy " in done.stdout

    train = rows[:3]
    assert [r["layout"] for r in train] == list(gpu_plan.LAYOUTS)
    for r in train:
        assert (r["micro_batch"], r["global_batch"], r["compiled"], r["steps"]) == (2, 4, False, 4)
        assert r["measured_steps"] == [3, 4]  # --skip 2 (the tiny mode's own: 1)
        assert 0 < r["tokens_per_s_min"] <= r["tokens_per_s_median"] <= r["tokens_per_s_max"]
        assert r["mfu_median"] is None and r["peak_mem_gib"] > 0  # the CPU: no bf16 peak, the resident set
        assert set(r["plan"]) == {"sharded", "unsharded"} and r["plan_total_gib"] == r["plan"]["sharded"] >= 0
        assert r["plan_accumulation"] is None and r["plan_rel_error"] is None and "CPU" in r["plan_note"]
        assert r["command"].startswith(f"python -m ladder_train.train --config recipes/{r['layout']}_1b.yaml")
        assert r["plan_command"].endswith("--dry-run --simulate 1x1 --json")

    profile = rows[3]
    assert (profile["layout"], profile["micro_batch"], profile["profile"]) == ("standard", 2, [1, 1, 3])
    assert profile["trace"] == "rank0_steps3-5.pt.trace.json" and profile["steps_traced"] == 3
    assert profile["busy_share"] is None and "no GPU events" in profile["note"]
    assert profile["kernels"] == profile["copies"] == 0 and profile["host_step_ms"] > 0
    with gzip.open(out / profile["trace_kept"]) as kept:  # the lease brings the kept trace back beside the rows
        assert any(e.get("ph") == "X" for e in json.load(kept)["traceEvents"])

    for r, layout in zip(rows[4:], gpu_plan.LAYOUTS, strict=True):
        args = ModelArgs(**{**PRESETS["tiny"], "vocab_size": 257, "n_layers": 2, "residual": layout})
        assert (r["layout"], r["batch"], r["n_layers"], r["compiled"]) == (layout, 1, 2, False)
        assert r["params"] == count_params(args)["total"]
        assert r["weight_bytes"] == 4 * r["params"] == r["bench_weight_bytes"]  # fp32 on the CPU
        assert r["tpot_ms"] > 0 and r["bandwidth_gb_s"] == pytest.approx(r["weight_bytes"] / r["tpot_ms"] / 1e6)

    env = rows[0]["env"]
    assert all(r["env"] == env for r in rows) and ceilings["env"] == env
    assert env["mode"] == "tiny" and env["device"] == "cpu" and env["card"] is None and env["driver"] is None
    assert env["torch"] == torch.__version__ and "cuda" in env and env["host"]["cpu_model"]
    assert env["started"].startswith(env["date"]) and "--tiny" in env["command"]
    assert env["git_commit"] is None or len(env["git_commit"]) == 40
    # what comes back from the device: at most 7 files (the tool brings back 8), the logs as one archive
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["check.log", "check_logs.tgz", "gpu.jsonl", "nvidia_smi.txt", profile["trace_kept"]]
    )
    with tarfile.open(out / "check_logs.tgz") as logs:
        names = {Path(name).name for name in logs.getnames() if name.startswith(f"logs/{env['invocation']}/")}
    assert {"train-ladder-mb2.log", "plan-train-ladder-mb2.log", "profile-standard-mb2.log", "decode.log"} <= names
    log = (out / "check.log").read_text()
    assert "gpu_check (tiny): CPU: " in log and "train    standard    2  " in log  # the table
    assert log in done.stdout
    assert not list(temp.glob("gpu_check_*")) and not list(temp.glob("tmp.*"))  # run and work folders removed
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if str(tokens) in _cmdline(p)]
    assert leftovers == []  # no part's process outlived it


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--variant", "bogus.key=1"], "override 'bogus.key=1': unknown key 'bogus'"),
        (["--set", "parallel.accumulate=bogus"], "bogus"),
        (["--steps", "0"], "argument --steps: an integer >= 1 (got '0')"),
        (["--skip", "-1"], "argument --skip: an integer >= 0 (got '-1')"),
        (["--decode-layers", "-1"], "argument --decode-layers: an integer >= 0 (got '-1')"),
        (
            ["--decode-layers", "5000"],
            "--decode-layers 5000: ladder-bench refuses the decode part: tiny: n_layers=5000",
        ),
        (["--tokens", "nowhere"], "--tokens nowhere: no such file or folder"),
        (["--tokenizer", "nowhere.json"], "--tokenizer nowhere.json: no such file"),
        (["--steps", "2", "--skip", "2"], "--skip 2 leaves no step of --steps 2 to measure"),
    ],
)
def test_a_bad_variant_or_setting_is_refused_before_any_part_runs(tmp_path, monkeypatch, capsys, flags, named):
    def no_part(*args, **kwargs):
        raise AssertionError("a part ran")

    monkeypatch.setattr(check, "run_parts", no_part)
    monkeypatch.setattr(check, "work_folder", no_part)
    monkeypatch.chdir(tmp_path)  # --tokens nowhere: relative to here
    assert check.main(["--tiny", "--out", str(tmp_path / "R"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu_check: error: ") and named in err[0], err
    assert not (tmp_path / "R").exists()  # no logs folder, no rows


@pytest.mark.parametrize("cuda", [False, True])
def test_a_gpu_run_without_a_gpu_or_its_token_folder_is_refused_in_one_line(tmp_path, monkeypatch, capsys, cuda):
    monkeypatch.setattr(check, "run_parts", lambda *args, **kwargs: pytest.fail("a part ran"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert check.main(["--out", str(tmp_path / "R"), "--tokens", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    named = f"no token folder at {tmp_path / 'nowhere'}" if cuda else "no CUDA device here"
    assert len(err) == 1 and err[0].startswith("gpu_check: error: ") and named in err[0], err
    assert not (tmp_path / "R").exists()


@pytest.mark.parametrize("inside", ["", "sub"])
def test_an_out_that_is_a_file_or_inside_one_is_refused_before_any_part_runs(tmp_path, monkeypatch, capsys, inside):
    monkeypatch.setattr(check, "run_parts", lambda *args, **kwargs: pytest.fail("a part ran"))
    (tmp_path / "rows.jsonl").write_text("{}\n")
    out = tmp_path / "rows.jsonl" / inside if inside else tmp_path / "rows.jsonl"
    assert check.main(["--tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"gpu_check: error: --out {out}: {tmp_path / 'rows.jsonl'} is not a folder (gpu.jsonl and logs/ go into a folder)"
    ]
    assert (tmp_path / "rows.jsonl").read_text() == "{}\n"


@pytest.mark.slow
def test_the_lease_script_exits_with_gpu_checks_status_not_tees(tmp_path):
    """gpu_lease.sh pipes gpu_check into tee: its status is gpu_check's (2: a refused flag), not tee's 0."""
    env = {
        **os.environ,
        "TINY": "1",
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
        "CHECK": "--tiny --steps 0",
    }
    done = subprocess.run(
        ["bash", "benchmarks/gpu_lease.sh", "check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert (
        "gpu_check: error: argument --steps: an integer >= 1 (got '0')" in (tmp_path / "out" / "check.log").read_text()
    )
