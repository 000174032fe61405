"""Matplotlib pictures the lessons draw: heatmaps (masks, attention weights, embedding tables) and RoPE rotations.

Each function draws on an `Axes` (a new one when `ax` is None) and returns it, so a lesson can lay several
pictures side by side with `plt.subplots` and still call one helper per panel.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

_DIVERGING = ("coolwarm", "RdBu", "RdBu_r", "bwr", "seismic", "PiYG", "PRGn")


def _new_axes(ax: Axes | None, size: tuple[float, float] = (4.0, 3.5)) -> Axes:
    return plt.subplots(figsize=size)[1] if ax is None else ax


def _visible(label: str) -> str:
    """Tick label for a token: spaces and control characters would be invisible."""
    return "␣" if label == " " else repr(label)[1:-1]


def heatmap(
    matrix: torch.Tensor,
    ax: Axes | None = None,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    fmt: str | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
) -> Axes:
    """Draw a 2-D tensor (rows top to bottom); with `fmt` (e.g. "{:.2f}") each value is written in its cell.

    A diverging `cmap` ("coolwarm", "RdBu"...) without `vmin`/`vmax` is centred on zero.
    """
    values = torch.as_tensor(matrix).detach().float().cpu()
    if values.dim() != 2:
        raise ValueError(f"heatmap draws a 2-D matrix, got shape {tuple(values.shape)}")
    if cmap in _DIVERGING and vmin is None and vmax is None:
        vmax = float(values.abs().max())
        vmin = -vmax
    ax = _new_axes(ax)
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    for labels, set_ticks, set_labels in (
        (row_labels, ax.set_yticks, ax.set_yticklabels),
        (col_labels, ax.set_xticks, ax.set_xticklabels),
    ):
        if labels is not None:
            set_ticks(range(len(labels)))
            set_labels([_visible(s) for s in labels])
    if fmt is not None:
        for i, row in enumerate(values.tolist()):
            for j, v in enumerate(row):
                r, g, b, _ = image.cmap(image.norm(v))
                dark_cell = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=8,
                        color="white" if dark_cell else "black")
    ax.set_title(title or "")
    ax.set_xlabel(xlabel or "")
    ax.set_ylabel(ylabel or "")
    return ax


def attention_map(
    weights: torch.Tensor, tokens: Sequence[str] | None = None, ax: Axes | None = None, title: str | None = None
) -> Axes:
    """One (T_q, T_k) attention pattern: row i is how query i spreads its attention over the keys."""
    return heatmap(weights, ax=ax, row_labels=tokens, col_labels=tokens, title=title,
                   xlabel="key position j", ylabel="query position i", vmin=0.0, vmax=1.0)


def attention_heads(weights: torch.Tensor, tokens: Sequence[str] | None = None) -> Figure:
    """All heads of one layer side by side; `weights` is (H, T, T) (one batch element)."""
    if weights.dim() != 3:
        raise ValueError(f"expected attention weights of shape (H, T, T), got {tuple(weights.shape)}")
    n_heads = weights.size(0)
    fig, axes = plt.subplots(1, n_heads, figsize=(3.2 * n_heads, 3.0), squeeze=False)
    for h, ax in enumerate(axes[0]):
        attention_map(weights[h], tokens, ax=ax, title=f"head {h}")
    fig.tight_layout()
    return fig


def rotation_arrows(points: torch.Tensor, ax: Axes | None = None, title: str | None = None) -> Axes:
    """Arrows from the origin to each row of a (T, 2) tensor, coloured by row (position) index."""
    points = torch.as_tensor(points).detach().float().cpu()
    if points.dim() != 2 or points.size(1) != 2:
        raise ValueError(f"expected (T, 2) points, got shape {tuple(points.shape)}")
    ax = _new_axes(ax, (3.5, 3.5))
    colours = plt.get_cmap("viridis")(torch.linspace(0, 1, len(points)).numpy())
    for t, ((x, y), colour) in enumerate(zip(points.tolist(), colours, strict=True)):
        ax.annotate("", xy=(x, y), xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": colour})
        ax.text(1.12 * x, 1.12 * y, str(t), color=colour, ha="center", va="center", fontsize=8)
    radius = 1.25 * float(points.norm(dim=1).max())
    ax.set_xlim(-radius, radius)
    ax.set_ylim(-radius, radius)
    ax.set_aspect("equal")
    ax.axhline(0, color="0.8", lw=0.5)
    ax.axvline(0, color="0.8", lw=0.5)
    ax.set_title(title or "")
    return ax


def flow_diagram(steps: Sequence[tuple[str, str]], ax: Axes | None = None, title: str | None = None) -> Axes:
    """Boxes left to right joined by arrows: each step is (name, shape), e.g. ("token ids", "(B, T)")."""
    ax = _new_axes(ax, (2.1 * len(steps), 1.6))
    for i, (name, shape) in enumerate(steps):
        ax.text(i, 0, f"{name}\n{shape}", ha="center", va="center", fontsize=9,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": "#e8f0fe", "edgecolor": "#4a6fa5"})
        if i:
            ax.annotate("", xy=(i - 0.36, 0), xytext=(i - 0.64, 0), arrowprops={"arrowstyle": "->"})
    ax.set_xlim(-0.5, len(steps) - 0.5)
    ax.set_ylim(-0.5, 0.5)
    ax.axis("off")
    ax.set_title(title or "")
    return ax
