"""Figures of the classification benchmark: reliability diagram and metrics against rotation.

Both draw into a given matplotlib ``Figure`` (so the napari tab can reuse them on its
Qt canvas) or, through :func:`save_benchmark_figures`, into PNG files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["draw_reliability", "draw_rotation", "save_benchmark_figures"]

_COLORS = {"map": "#444444", "map-temp": "#999999", "lla-sampled": "#1f77b4",
           "lla-sampled-probit": "#17becf", "lla-last-layer": "#ff7f0e",
           "lla-exact": "#d62728", "lla-exact-probit": "#ff9896", "mc-dropout": "#2ca02c",
           "laplace-torch": "#9467bd", "laplace-torch-ll": "#c5b0d5"}


def _color(name: str) -> str:
    """A method's colour; a ``-val`` variant shares its base method's (drawn dashed)."""
    return _COLORS.get(name.removesuffix("-val").removesuffix("-prior"), "#8c564b")


def _ls(name: str) -> str:
    return "--" if name.endswith("-val") or name == "map-temp" else "-"


def draw_reliability(ax, reliabilities: dict, fg: str = "black") -> None:
    """Reliability diagram: accuracy against mean confidence per bin, one line per method.

    Parameters
    ----------
    ax : matplotlib Axes
    reliabilities : dict
        Method → :func:`ctuq.classify.metrics.reliability` output.
    """
    ax.plot([0, 1], [0, 1], ls=":", color=fg, lw=1, label="ideal")
    n_bins = None
    for name, rel in reliabilities.items():
        conf = np.asarray(rel["confidence"], dtype=float)
        acc = np.asarray(rel["accuracy"], dtype=float)
        ok = np.asarray(rel["count"]) > 0
        ax.plot(conf[ok], acc[ok], marker="o", ms=3, lw=1.2, color=_color(name), ls=_ls(name),
                label=name)
        n_bins = rel.get("n_bins", n_bins)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability ({n_bins} bins)" if n_bins else "reliability")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")


def draw_rotation(ax_acc, ax_nll, rotations: dict, fg: str = "black") -> None:
    """Accuracy and NLL against rotation angle, one line per method.

    Parameters
    ----------
    ax_acc, ax_nll : matplotlib Axes
    rotations : dict
        Method → list of ``{"angle", "accuracy", "nll"}`` or, for several
        seeds, ``{"angle", "accuracy", "nll", "accuracy_std", "nll_std"}``.
    """
    for name, rows in rotations.items():
        ang = [r["angle"] for r in rows]
        for ax, key in ((ax_acc, "accuracy"), (ax_nll, "nll")):
            val = np.asarray([r[key] for r in rows])
            ax.plot(ang, val, marker="o", ms=3, lw=1.2, color=_color(name), ls=_ls(name),
                    label=name)
            if f"{key}_std" in rows[0]:
                sd = np.asarray([r[f"{key}_std"] for r in rows])
                ax.fill_between(ang, val - sd, val + sd, color=_color(name), alpha=0.15)
    ax_acc.set_ylabel("accuracy")
    ax_nll.set_ylabel("NLL (nats)")
    ax_nll.set_yscale("log")
    for ax in (ax_acc, ax_nll):
        ax.set_xlabel("rotation (degrees)")
    ax_acc.set_title("accuracy under rotation")
    ax_nll.set_title("NLL under rotation")
    ax_acc.legend(fontsize=7)


def save_benchmark_figures(out_dir, reliabilities: dict, rotations: dict,
                           title: str = "", prefix: str = "") -> list[Path]:
    """Write ``<prefix>reliability.png`` and ``<prefix>rotation.png`` into ``out_dir``.

    Returns their paths.
    """
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(4.5, 4.2))
    draw_reliability(fig.add_subplot(1, 1, 1), reliabilities)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    rel_path = out_dir / f"{prefix}reliability.png"
    fig.savefig(rel_path, dpi=110)
    fig = Figure(figsize=(9, 3.6))
    draw_rotation(fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2), rotations)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    rot_path = out_dir / f"{prefix}rotation.png"
    fig.savefig(rot_path, dpi=110)
    return [rel_path, rot_path]
