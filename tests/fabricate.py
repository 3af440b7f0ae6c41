"""Run folders written by hand (config, metrics, eval results), for the report's and the study's tests."""

import json
import math

from ladder_train.config import load_config, save_config


def fabricate_run(root, name, residual, base_loss, overrides=(), summary=None):
    """A run whose final validation loss is ``base_loss + 1``; ``summary`` replaces its eval results."""
    run = root / name
    run.mkdir()
    config = [f"run.name={name}", f"model.residual={residual}", "model.preset=tiny", "data.seq_len=128", *overrides]
    save_config(load_config(None, config), run / "config.yaml")
    lines = []
    for step in range(1, 11):
        lines.append(
            {
                "step": step,
                "loss": base_loss + 10 - step,
                "lr": 1e-3 * step / 10,
                "grad_norm": 1.0,
                "tokens": 1000 * step,
                "tokens_per_s": 500.0 + step,
            }
        )
        if step % 5 == 0:
            lines.append(
                {
                    "step": step,
                    "tokens": 1000 * step,
                    "val_loss": base_loss + 11 - step,
                    "val_ppl": math.exp(base_loss + 11 - step),
                }
            )
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (run / "eval").mkdir()
    if summary is None:
        summary = {"arc_easy_local": {"acc": 0.30, "acc_norm": 0.25 + base_loss / 100}, "piqa_local": {"acc": 0.55}}
    (run / "eval" / "step-10.json").write_text(json.dumps({"summary": summary}))
    return run
