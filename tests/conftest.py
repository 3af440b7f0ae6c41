import multiprocessing.process
import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SHARED = Path(os.environ.get("LADDER_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


@pytest.fixture(autouse=True)
def _fp32_single_thread():
    torch.set_num_threads(1)
    yield


def _frames_compiled() -> int:
    dynamo = sys.modules.get("torch._dynamo.utils")  # never imported: nothing was compiled
    return dynamo.counters["frames"]["ok"] if dynamo else 0


@pytest.fixture(autouse=True)
def _compiling_tests_are_marked_slow(request):
    # make test-fast is the inner loop: a test that compiles (seconds each on the CPU) belongs to make test
    before = _frames_compiled()
    yield
    if request.node.get_closest_marker("slow") is None and _frames_compiled() > before:
        pytest.fail("this test compiles with torch.compile: mark it @pytest.mark.slow", pytrace=False)


_processes_started: list[str] = []


def _counting_starts(start, name_of):
    def counted(*args, **kwargs):
        name = name_of(*args, **kwargs)
        if name is not None:
            _processes_started.append(name)
        return start(*args, **kwargs)

    return counted


def _command_name(popen, args, *rest, **kwargs) -> str | None:
    words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    if Path(words[0]).name in _CHEAP_TOOLS:
        return None
    return " ".join(words[:3])


# tools that start in milliseconds (lm-eval asks git for its version on every evaluation, platform.processor()
# asks uname)
_CHEAP_TOOLS = {"git", "uname"}


# every way a test starts a process: subprocess (and so torchrun), multiprocessing (loader workers, mp.spawn) and
# the fork server's own start
subprocess.Popen._execute_child = _counting_starts(subprocess.Popen._execute_child, _command_name)
multiprocessing.process.BaseProcess.start = _counting_starts(
    multiprocessing.process.BaseProcess.start, lambda process: f"multiprocessing {process.name}"
)
multiprocessing.util.spawnv_passfds = _counting_starts(
    multiprocessing.util.spawnv_passfds, lambda path, args, fds: "multiprocessing's fork server or resource tracker"
)


@pytest.fixture(autouse=True)
def _spawning_tests_are_marked_slow(request):
    # a process start costs seconds of imports on the CPU: the inner loop (make test-fast) stays in this process
    before = len(_processes_started)
    yield
    started = _processes_started[before:]
    if request.node.get_closest_marker("slow") is None and started:
        pytest.fail(f"this test starts a process ({started[0]}): mark it @pytest.mark.slow", pytrace=False)


@pytest.fixture(autouse=True)
def _environment_restored():
    # a trainer run in this process sets torchrun's variables for its group of one (RANK, WORLD_SIZE, ...): a later
    # test must not see them (ladder-bench would take itself for a torchrun rank)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}: the local tokenizer and data samples are needed")
    return SHARED


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct (a real pretrained Llama) as a Hugging Face folder, converted once per test session
    from the GGUF in ../shared by its own script (sharded safetensors, tokenizer.json, chat template)."""
    import subprocess
    import sys

    script = SHARED / "models" / "smollm2-135m-instruct" / "to_hf.py"
    if not script.is_file():
        pytest.skip(f"{script} not found: the pretrained SmolLM2 model is needed")
    pytest.importorskip("gguf", reason="the SmolLM2 conversion script needs the gguf package")
    folder = tmp_path_factory.mktemp("smollm2") / "hf"
    subprocess.run([sys.executable, str(script), str(folder)], check=True, capture_output=True, timeout=300)
    return folder


class Exported:
    def __init__(self, returncode: int, stderr: str):
        self.returncode, self.stderr = returncode, stderr


@pytest.fixture
def export(capsys):
    """ladder-export in this process (a new process per call would add ~8 s of imports), under the console
    scripts' error policy."""
    from ladder_train.cli import run_command
    from ladder_train.cli.export import run as export_command

    def run(checkpoint: Path, out: Path) -> Exported:
        capsys.readouterr()
        code = run_command("ladder-export", export_command, [str(checkpoint), str(out)])
        return Exported(code, capsys.readouterr().err)

    return run


@pytest.fixture
def launch():
    """``launch(*args, env=..., cwd=..., stdout=..., stderr=...)``: ``launch.start`` (tests/launch.py: ``python
    ARGS`` or a console command, offline, one thread, its own session) for this test; at teardown every process of
    each session it started is killed, so none outlives the test (mark the test slow: it starts a process)."""
    import launch as launching  # imported here: tests/test_structure.py runs this file without its folder

    started = []

    def start(*args, **kwargs):
        started.append(launching.start(*args, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        launching.end(proc)
