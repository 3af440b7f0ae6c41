"""A link planted where a run of several processes writes a checkpoint (RUN_DIR/checkpoints/step-N.partial, step-N):
rank 0 alone makes, renames and removes those folders, and every rank learns what it found, so that all end with its
one line and none is left waiting in a collective (2 gloo processes). One process: tests/test_bad_input_train.py."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from cli_errors import someones_folder, untouched
from dist_utils import run_ranks

from ladder_train.checkpoint import Checkpointer
from ladder_train.config import load_config
from ladder_train.errors import InputError, RunFailed
from ladder_train.model import ModelArgs, Transformer
from ladder_train.parallel import init_distributed

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "recipes" / "smoke.yaml")
TIMEOUT_S = 30  # each collective's: a rank left waiting fails the test in this time, instead of hanging it


def _refused(link: Path) -> str:
    return f"{link} is a symbolic link; a folder of this project is never written through a link: remove it"


def _outcome(action) -> tuple:
    """("saved",), or the error's type, line and whether it is quiet (printed by another rank)."""
    try:
        action()
    except (InputError, RunFailed) as err:
        return type(err).__name__, str(err), getattr(err, "quiet", False)
    return ("saved",)


def saves_meeting_links(run_dir: str, elsewhere: str) -> list[tuple]:
    """On each rank: the outcome of a save into a planted step-N.partial, of one whose step-N is a link, of one whose
    step-N becomes a link while its files are written in the background, then of a save with no link."""
    env = init_distributed(TIMEOUT_S, cpu=True)
    try:
        cfg = load_config(None, ["checkpoint.async_save=true"])
        model = Transformer(ModelArgs(vocab_size=64, dim=16, n_layers=1, n_heads=2, ffn_dim=32, max_seq_len=16))
        optimizer = torch.optim.AdamW(model.parameters())
        checkpointer = Checkpointer(cfg.checkpoint, Path(run_dir), env.rank, env.world_size)
        folder = checkpointer.folder

        def save(step: int) -> None:
            checkpointer.save(step, model, optimizer, {"step": step}, {})
            checkpointer.finish()

        def plant(name: str) -> None:  # rank 0 alone looks at these names
            if env.is_main:
                (folder / name).symlink_to(elsewhere)

        outcomes = []
        for step, name in ((1, "step-1.partial"), (2, "step-2")):
            plant(name)
            outcomes.append(_outcome(lambda step=step: save(step)))
        checkpointer.save(3, model, optimizer, {"step": 3}, {})
        plant("step-3")
        outcomes.append(_outcome(checkpointer.finish))
        if env.is_main:
            for name in ("step-1.partial", "step-2", "step-3"):
                (folder / name).unlink()
        outcomes.append(_outcome(lambda: save(4)))  # every rank still at the same collective: the run goes on
        return outcomes
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_link_at_a_checkpoint_folder_ends_every_rank_with_rank_0s_line(tmp_path):
    elsewhere = someones_folder(tmp_path)
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    ranks = run_ranks(saves_meeting_links, 2, str(tmp_path / "run"), str(elsewhere))
    lines = [_refused(folder / name) for name in ("step-1.partial", "step-2", "step-3")]
    for rank, outcomes in enumerate(ranks):
        assert outcomes == [*(("InputError", line, rank != 0) for line in lines), ("saved",)]
    assert untouched(elsewhere)
    assert sorted(p.name for p in folder.iterdir()) == ["step-3.partial", "step-4"]


def train_from_the_command_line(argv: list[str]) -> tuple[int, list[str]]:
    """ladder-train on this rank: its exit status and the lines it printed on stderr."""
    import ladder_train.cli as cli

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = cli.main(argv)
    return status, [line for line in stderr.getvalue().splitlines() if line.startswith("ladder-train: ")]


@pytest.mark.slow
def test_a_two_process_run_meeting_a_checkpoint_link_exits_with_one_line(tmp_path):
    elsewhere = someones_folder(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    link = run / "checkpoints" / "step-2.partial"
    link.symlink_to(elsewhere)  # the final checkpoint's folder while it is written
    argv = ["--config", SMOKE, f"run.dir={run}", "train.max_steps=2", "data.num_workers=0"]
    argv += ["wandb.mode=disabled", f"parallel.timeout_s={TIMEOUT_S}"]
    ranks = run_ranks(train_from_the_command_line, 2, argv)
    assert ranks == [(2, [f"ladder-train: error: {_refused(link)}"]), (2, [])]  # printed once, by rank 0
    assert untouched(elsewhere)
