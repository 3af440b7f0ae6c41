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
    legend_below: bool = False,
) -> Path:
    """Label ``ax`` (labels left as they are when None), add a light grid and the legend, write ``path`` at 120
    dpi and close the figure; returns ``path``. ``legend_below`` sets the legend under the axes, where long or
    many labels cannot cover the lines, and lets the image grow to hold it."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis=grid_axis)
    placement = dict(loc="upper center", bbox_to_anchor=(0.5, -0.15)) if legend_below else {}
    ax.legend(fontsize=legend_size, **placement) if legend_size else ax.legend(**placement)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight" if legend_below else None)
    plt.close(fig)
    return path


def new_figure(width: float, height: float):
    """A figure and its axes, ``width`` x ``height`` inches."""
    return plt.subplots(figsize=(width, height))


def series_colour(i: int, n: int):
    """The colour of series ``i`` of ``n``: matplotlib's default cycle up to 10 series; beyond, tab20's 20 colours,
    so a sweep's 15 runs do not repeat the first ten's colours."""
    return f"C{i}" if n <= 10 else plt.get_cmap("tab20")(i % 20)
