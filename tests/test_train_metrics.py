"""What the training loop logs (ladder_train/train/observability.py): wandb's offline fallback without credentials,
each metrics row's UTC wall-clock time, and MFU: the peak by exact card and the FLOPs of frozen layers."""

import json
from datetime import UTC

import pytest
import torch
import torch.distributed as dist
from test_train import SEQ, global_batches, tiny_config


@pytest.mark.slow
def test_wandb_online_without_credentials_falls_back_to_offline(tmp_path, monkeypatch, capsys):
    from ladder_train.train.observability import MetricLogger

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    cfg = tiny_config("standard", 8, str(tmp_path / "run"), **{"wandb.mode": "online"})
    logger = MetricLogger(cfg, tmp_path / "run", is_main=True)
    try:
        assert logger.wandb_run is not None and logger.wandb_run.settings.mode == "offline"
        assert logger.wandb_run.config["model"]["residual"] == "standard"  # the resolved config is logged
        logger.log({"step": 1, "loss": 1.5, "lr": 1e-3, "grad_norm": 0.5}, console=False)
    finally:
        logger.close()
    assert "online init failed" in capsys.readouterr().err
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text())["loss"] == 1.5


def test_metrics_rows_carry_their_wall_clock_time_in_utc(tmp_path):
    from datetime import datetime, timedelta

    from ladder_train.train.observability import MetricLogger

    cfg = tiny_config("standard", 8, str(tmp_path / "run"))
    logger = MetricLogger(cfg, tmp_path / "run", is_main=True)
    before = datetime.now(UTC).replace(microsecond=0)
    logger.log({"step": 1, "loss": 1.5}, console=False)
    logger.log({"step": 2, "loss": 1.4}, console=False)
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    stamps = [datetime.fromisoformat(row["time"]) for row in rows]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(s.utcoffset() == timedelta(0) for s in stamps)
    assert before <= stamps[0] <= stamps[1] <= datetime.now(UTC)


# MFU: the peak by exact card (a PCIe or NVL H100 is not the SXM card's 989.4 TF) and frozen layers not counted
@pytest.mark.parametrize(
    "card, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
    ],
)
def test_mfu_peak_by_exact_card(monkeypatch, card, peak):
    from ladder_train.train.observability import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    assert device_peak_flops(torch.device("cuda", 0)) == pytest.approx(peak, rel=1e-12)
    assert device_peak_flops(torch.device("cpu")) is None  # MFU null on the CPU


def test_mfu_of_an_unknown_card_is_null_with_one_note(monkeypatch, capsys):
    from ladder_train.train import observability

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 test-variant")
    monkeypatch.setattr(observability, "_UNKNOWN_CARDS", set())
    assert observability.device_peak_flops(torch.device("cuda", 0)) is None
    assert observability.device_peak_flops(torch.device("cuda", 1)) is None
    assert capsys.readouterr().err.count("no bf16 peak known for 'NVIDIA H100 test-variant'") == 1


def test_flops_per_token_of_frozen_layers():
    from ladder_train.model import flops_per_token, preset_args

    # tiny: 2 layers, dim 64, 4 heads (head dim 16, 4 kv heads), FFN 176, vocab 49,152, untied head, standard.
    # block matmuls 64 x 16 x 16 (q, k, v, o) + 3 x 64 x 176 = 16,384 + 33,792 = 50,176; norms 2 x 2 x 64 + 64;
    # blocks + norms + head = 100,672 + 3,145,728 = 3,246,400; attention at seq 128: 12 x 2 x 64 x 128 = 196,608
    args = preset_args("tiny")
    assert flops_per_token(args, 128) == 6 * 3_246_400 + 196_608 == 19_675_008
    # a frozen block skips its weight gradients: 4 x 50,176 instead of 6 x (input gradients still flow to the
    # trainable embeddings); its attention scores and values keep their 12 x dim x seq
    assert flops_per_token(args, 128, frozen_layers=1) == 19_675_008 - 2 * 50_176 == 19_574_656
    assert flops_per_token(args, 128, frozen_layers=2) == 19_474_304


@pytest.mark.slow
def test_trainer_meter_counts_frozen_layers(tmp_path):
    from ladder_train.model import flops_per_token
    from ladder_train.parallel import init_distributed
    from ladder_train.train import Trainer

    env = init_distributed()
    try:
        cfg = tiny_config("ladder", 8, str(tmp_path), **{"train.freeze_layers": 1})
        trainer = Trainer(cfg, env, batches=global_batches(0, 1, 8))
        frozen = flops_per_token(trainer.model_args, SEQ, frozen_layers=1)
        assert trainer.meter.flops_per_token == frozen < flops_per_token(trainer.model_args, SEQ)
    finally:
        dist.destroy_process_group()
