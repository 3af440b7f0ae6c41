"""One training run's numbers as read from its folder, and the folders a report reads (a study's runs)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, load_config


@dataclass
class Run:
    """One training run's numbers, as read from its folder."""

    path: Path
    name: str
    residual: str
    seed: int = 0
    config: object = None  # the run's resolved Config
    train: list[dict] = field(default_factory=list)  # {"step", "tokens", "loss", "lr", ...}
    val: list[dict] = field(default_factory=list)  # {"step", "tokens", "val_loss", "val_ppl"}
    eval_summary: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name if self.residual in self.name else f"{self.name} ({self.residual})"


def read_run(path: Path) -> Run:
    metrics = path / "metrics.jsonl"
    config = path / "config.yaml"
    for required in (metrics, config):
        if not required.is_file():
            raise ConfigError(f"{path}: not a run folder (missing {required.name})")
    cfg = load_config(config)
    run = Run(path=path, name=cfg.run.name, residual=cfg.model.residual, seed=cfg.run.seed, config=cfg)
    for record in read_metrics(metrics):
        if "val_loss" in record:
            run.val.append(record)
        elif "loss" in record:
            run.train.append(record)
    # a resumed run logs replayed steps again: keep the last record of each step
    run.train = list({r["step"]: r for r in run.train}.values())
    run.val = list({r["step"]: r for r in run.val}.values())
    evals = sorted((path / "eval").glob("step-*.json"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    if evals:
        run.eval_summary = json.loads(evals[-1].read_text()).get("summary", {})
    return run


def loss_unit(runs: list[Run]) -> str:
    """The unit of the runs' losses: nats/byte where every run reads bytes (the byte tokenizer, one token a byte),
    nats/token otherwise."""
    return "nats/byte" if runs and all(run.config.data.tokenizer == "byte" for run in runs) else "nats/token"


def read_metrics(path: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` in file order (blank lines skipped); a line that is not JSON is a
    ConfigError naming it."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{number}: not a JSON line") from None
    return records


def final_train_loss(run: Run, last: int = 5) -> float | None:
    """Mean of the last ``last`` logged training losses (one step's loss is noisy)."""
    losses = [r["loss"] for r in run.train[-last:]]
    return statistics.fmean(losses) if losses else None


def train_tokens_per_s(run: Run) -> float | None:
    values = [r["tokens_per_s"] for r in run.train if r.get("tokens_per_s")]
    return statistics.median(values) if values else None
