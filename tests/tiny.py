"""The tiny training run the trainer tests share: a 2-layer, 32-wide model of the given vocabulary and sequence
length, wandb off, as ``key=value`` overrides on the defaults; each test adds the keys that make it its own."""

from __future__ import annotations

from ladder_train.config import Config, load_config


def tiny_run_config(run_dir: str, vocab: int, seq: int, residual: str = "ladder", **extra) -> Config:
    overrides = {
        "run.dir": run_dir,
        "model.vocab_size": vocab,
        "model.dim": 32,
        "model.n_layers": 2,
        "model.n_heads": 4,
        "model.ffn_dim": 64,
        "model.max_seq_len": seq,
        "model.residual": residual,
        "data.seq_len": seq,
        # tokenizing in the trainer: a loader's fork server costs a process start (the worker path has its own
        # tests: test_data_workers, test_train_signals, the SIGKILL resume)
        "data.num_workers": 0,
        "train.log_every": 1,
        "wandb.mode": "disabled",
        **extra,
    }
    return load_config(None, [f"{k}={v}" for k, v in overrides.items()])
