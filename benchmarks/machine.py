"""The machine a GPU benchmark runs on (gpu_check, gpu_study): what a bare, offline one lacks (``ensure_imports``: the
wheels gpu_prepare.sh put in .gpu/whl, installed by pip into .gpu/site), the parts' environment and work folder, and
what the rows say of it (``environment``: the library's record with the card, driver, CUDA and the project's commit).
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.parts import REPO

GPU_DIR = REPO / ".gpu"
# what the parts import that a bare GPU machine may lack (.gpu/whl has the pure-Python ones)
NEEDED_MODULES = ("torch", "omegaconf", "datasets", "torchdata", "tokenizers", "pyarrow", "numpy", "yaml")


def install_wheels(wheels: list[Path], site: Path) -> None:
    """The wheels into ``site`` by pip, offline (``--no-index``), without their dependencies (gpu_prepare.sh fetched
    each one a bare machine lacks)."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: pip could not install {site.parent.name}/whl: {done.stderr.strip()[-300:]}")


def ensure_imports(gpu_dir: Path = GPU_DIR) -> Path | None:
    """What the parts import, from ``gpu_dir``/whl (installed into ``gpu_dir``/site) when the machine lacks it; the
    site folder the children need on their path, or None."""
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    wheels = sorted((gpu_dir / "whl").glob("*.whl"))
    site = gpu_dir / "site"
    if wheels:
        install_wheels(wheels, site)
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    still = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    if still:
        raise SystemExit(
            f"gpu_check: cannot import {', '.join(still)}: run `bash benchmarks/gpu_prepare.sh` on the development "
            f"machine and bring {gpu_dir.name}/ (its whl/) along"
        )
    return site


def child_env(site: Path | None, tiny: bool) -> dict:
    env = dict(os.environ)
    paths = [str(REPO)] + ([str(site)] if site else []) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if tiny:  # the CPU: every part in one thread, several parts at once
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    return env


def work_folder(tiny: bool) -> Path:
    """Run folders: /dev/shm when it has room (a stopped 1.2B run may have begun its save), else the temp dir."""
    shm = Path("/dev/shm")
    usable = not tiny and shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 32 * 2**30
    return Path(tempfile.mkdtemp(prefix="gpu_check_", dir=shm if usable else None))


def nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run([exe, *query], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = [x for x in done.stdout.splitlines() if x.strip()]
    if done.returncode != 0 or not lines:
        return {}
    name, driver, memory = (x.strip() for x in (lines[0].split(",") + ["", ""])[:3])
    return {
        "card": name,
        "driver": driver,
        "gpu_memory_mib": int(float(memory)) if memory else None,
        "gpus": len(lines),
    }


COMMIT_FILE = GPU_DIR / "commit"  # gpu_prepare.sh: the checkout's commit, for a copy of it that is no git checkout


def project_commit() -> tuple[str | None, bool | None]:
    """The project's commit and whether tracked files differ from it: git's when REPO is the top of a git checkout,
    else what gpu_prepare.sh recorded in .gpu/commit (a copied tree inside another repository must not report that
    repository's commit)."""
    top = git("rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == REPO:
        status = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD"), None if status is None else bool(status)
    try:
        commit, dirty = COMMIT_FILE.read_text().split()[:2]
    except (OSError, ValueError):
        return None, None
    return commit, dirty == "dirty"


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(argv: list[str], started: datetime.datetime, tiny: bool, module: str = "benchmarks.gpu_check") -> dict:
    """The library's environment record of this invocation (its id, command, dates, host) with the card, driver,
    torch, CUDA and commit (after the parts ran: asking torch for the card makes a CUDA context)."""
    import torch

    from ladder_train.bench import environment as record

    smi = {} if tiny else nvidia_smi()
    card = smi.get("card") or (torch.cuda.get_device_name(0) if torch.cuda.is_available() and not tiny else None)
    commit, dirty = project_commit()
    return {
        **record.invocation(["python", "-m", module, *argv], started),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "tiny" if tiny else "gpu",
        "device": "cuda" if card else "cpu",
        "card": card,
        "driver": smi.get("driver"),
        "gpu_memory_mib": smi.get("gpu_memory_mib"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "git_commit": commit,
        "git_dirty": dirty,
        "host": record.host(),
    }
