"""The ``ladder-train`` command. ``ladder-train --config R [key=value ...]`` trains; subcommands:
``show`` (resolved config and model size), ``demo`` (the quick start's job)."""

from __future__ import annotations

import argparse
import sys

from .config import ConfigError, load_config, model_args, to_yaml


def _config_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", help="a recipe YAML (recipes/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. model.n_layers=4")
    return parser


def _layout_summary(layouts: list[str]) -> str:
    """['standard', 'standard', 'ladder'] -> '2 standard + 1 ladder'."""
    runs: list[list] = []
    for layout in layouts:
        if runs and runs[-1][1] == layout:
            runs[-1][0] += 1
        else:
            runs.append([1, layout])
    return " + ".join(f"{n} {layout}" for n, layout in runs)


def cmd_show(argv: list[str]) -> int:
    """Print the resolved config and the model's size."""
    from .model.presets import count_params, flops_per_token

    args = _config_parser("ladder-train show").parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    print(to_yaml(cfg), end="")
    margs = model_args(cfg.model)
    counts = count_params(margs)
    print(
        f"# parameters: {counts['total'] / 1e6:,.1f}M total, {counts['non_embedding'] / 1e6:,.1f}M non-embedding; "
        f"{flops_per_token(margs, cfg.data.seq_len) / 1e9:,.2f} GFLOPs/token (train); layers: {_layout_summary(margs.layer_layouts())}"
    )
    return 0


def cmd_demo(argv: list[str]) -> int:
    """Train the three layouts briefly, evaluate them, benchmark TP = 2, write the report."""
    from .demo import main as demo_main

    return demo_main(argv)


SUBCOMMANDS = {"show": cmd_show, "demo": cmd_demo}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        from .train import main as train_main  # the default command: train

        return train_main(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
