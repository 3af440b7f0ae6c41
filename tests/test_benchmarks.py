"""The developer benchmarks (benchmarks/): the trainer benchmark times the steps it was asked for."""

import math
import subprocess

import pytest
from launch import REPO, TINY_TRAINING, run_from_repo


def run_bench(tmp_path, code: str) -> subprocess.CompletedProcess:
    return run_from_repo(tmp_path, "-c", code)


@pytest.mark.slow
def test_trainer_benchmark_rounds_each_train_the_asked_steps(tmp_path):
    # a second round in a reused run folder resumed at max_steps and "trained" nothing at 100x the speed
    code = f"from benchmarks.train_step import main; main(['--steps', '3', '--rounds', '2', *{TINY_TRAINING!r}])"
    done = run_bench(tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("trainer"))
    assert line.endswith("; each ran 3 steps in a fresh run folder)"), line
    rounds = [float(x.replace(",", "")) for x in line.split("rounds: ")[1].split(";")[0].split(", ")]
    assert len(rounds) == 2 and max(rounds) / min(rounds) < 5, line
    assert not (tmp_path / "runs").exists()  # nothing left behind for a later run to resume from


@pytest.mark.slow
def test_trainer_benchmark_fails_loudly_when_a_round_runs_fewer_steps(tmp_path):
    code = f"""
from benchmarks import train_step as bench
from ladder_train.train import trainer
real_train = trainer.Trainer.train
def short_train(self):  # a trainer that stops early, as a resumed run does
    self.max_steps = 1
    return real_train(self)
trainer.Trainer.train = short_train
bench.main(['--steps', '3', '--rounds', '1', *{TINY_TRAINING!r}])
"""
    done = run_bench(tmp_path, code)
    assert done.returncode != 0
    assert "BenchmarkError: trainer round ran 1 steps (from step 0, 1 logged) instead of 3" in done.stderr


def test_bare_loop_runs_on_the_trainers_device(monkeypatch, capsys):
    # it stayed on the CPU on a GPU node; now main() hands it init_distributed()'s device, as the trainer gets.
    # A meta "device" stands in for the GPU: every forward must see the model and the batch on it.
    import torch

    from benchmarks import train_step as bench
    from ladder_train.parallel.mesh import RankEnv

    seen = []

    class Spy(bench.Transformer):
        def forward(self, tokens, *args, **kwargs):
            seen.append((tokens.device.type, self.tok_embeddings.weight.device.type))
            return super().forward(tokens, *args, **kwargs)

    monkeypatch.setattr(bench, "Transformer", Spy)
    monkeypatch.setattr(bench, "init_distributed", lambda: RankEnv(0, 1, 0, 1, torch.device("meta")))
    monkeypatch.setattr(bench, "trainer_loop", lambda cfg, batches, steps, env: 1.0)
    monkeypatch.setattr(bench.dist, "destroy_process_group", lambda: None)
    bench.main(["--steps", "2", "--rounds", "1", *TINY_TRAINING])
    assert seen and set(seen) == {("meta", "meta")}
    assert capsys.readouterr().out.startswith("bare loop : ")


@pytest.mark.slow
def test_the_unigram_floor_of_the_study_is_reproduced_from_its_data(tmp_path, monkeypatch):
    """benchmarks/unigram_baseline.py gives the committed figure again, from the study's own data."""
    import json

    if not (REPO.parent / "shared" / "data" / "fineweb").is_dir():
        pytest.skip("../shared not found: the study's FineWeb sample is needed")
    from benchmarks.unigram_baseline import main

    monkeypatch.chdir(REPO)  # the recipe names ../shared relative to the repository
    assert main(["--out", str(tmp_path / "unigram.json")]) == 0
    made = json.loads((tmp_path / "unigram.json").read_text())
    committed = json.loads((REPO / "docs/results/study_small/unigram.json").read_text())
    assert made["val_tokens"] == 80 * 16 * 512 and made["train_tokens"] == committed["train_tokens"]
    assert made["nats_per_byte"] == pytest.approx(committed["nats_per_byte"], abs=1e-9)
    assert 3.0 < made["nats_per_byte"] < math.log(257)  # better than uniform over the 257 tokens


def test_train_ab_refuses_a_bad_variant_in_one_error_line(capsys):
    from benchmarks import train_ab

    with pytest.raises(SystemExit) as exited:
        train_ab.main(["--a", "bogus=1", "--b", "x=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("benchmarks.train_ab: error: ") and "unknown key 'bogus'" in err[0], err


def test_loss_ab_on_cuda_without_cuda_is_one_line(monkeypatch, capsys):
    import torch

    from benchmarks import loss_ab

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exited:
        loss_ab.main(["--device", "cuda", "--rounds", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and err == ["benchmarks.loss_ab: error: --device cuda: no CUDA device here"], err
