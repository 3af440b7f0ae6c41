"""Figures written as PNG files (matplotlib's Agg backend: no display): the one way every plot is labelled,
saved and closed."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def save_figure(
    fig,
    ax,
    path: Path,
    *,
    title: str,
    xlabel: str | None = None,
    ylabel: str | None = None,
    legend_size: float | None = None,
    grid_axis: str = "both",
) -> Path:
    """Label ``ax`` (labels left as they are when None), add a light grid and the legend, write ``path`` at 120
    dpi and close the figure; returns ``path``."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis=grid_axis)
    ax.legend(fontsize=legend_size) if legend_size else ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def new_figure(width: float, height: float):
    """A figure and its axes, ``width`` x ``height`` inches."""
    return plt.subplots(figsize=(width, height))
