"""The plot docked under the viewer: calibration curve and EM trace of a result."""

from __future__ import annotations

import numpy as np
from qtpy.QtWidgets import QVBoxLayout, QWidget


class ResultPlot(QWidget):
    """Calibration curve and EM trace of a :class:`~ctuq.data.io.Result` (matplotlib).

    Parameters
    ----------
    theme : str, optional
        napari theme id; the figure takes its background and text colours.
    """

    def __init__(self, theme: str | None = None, parent=None):
        super().__init__(parent)
        from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
        from matplotlib.figure import Figure

        self._colors = self._theme_colors(theme)
        self.figure = Figure(figsize=(8.0, 2.8), facecolor=self._colors["bg"])
        self.canvas = FigureCanvasQTAgg(self.figure)
        self.canvas.setMinimumHeight(240)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.canvas)
        self.show_result(None)

    @staticmethod
    def _theme_colors(theme) -> dict:
        colors = {"bg": "white", "fg": "black"}
        if theme:
            try:
                from napari.utils.theme import get_theme

                t = get_theme(theme)
                colors = {"bg": t.background.as_hex(), "fg": t.text.as_hex()}
            except Exception:  # noqa: BLE001 - a custom theme without these colours
                pass
        return colors

    def _style(self, ax):
        ax.set_facecolor(self._colors["bg"])
        for spine in ax.spines.values():
            spine.set_color(self._colors["fg"])
        ax.tick_params(colors=self._colors["fg"], labelsize=8)
        ax.xaxis.label.set_color(self._colors["fg"])
        ax.yaxis.label.set_color(self._colors["fg"])
        ax.title.set_color(self._colors["fg"])

    def show_result(self, result) -> None:
        """Draw the plots of ``result`` (None: an empty figure with a hint)."""
        from ctuq.app.figures import calibration_curve

        fig = self.figure
        fig.clear()
        ax_cal, ax_em = fig.subplots(1, 2)
        for ax in (ax_cal, ax_em):
            self._style(ax)
        fg = self._colors["fg"]
        truth = None if result is None else result.ground_truth
        if truth is not None:
            expected, observed = calibration_curve(truth, result.reconstruction, result.std)
            ax_cal.plot([0, 1], [0, 1], "--", color=fg, lw=1, label="ideal")
            ax_cal.plot(expected, observed, "o-", ms=3, color="#f4a261", label="ctuq")
            ax_cal.set_xlim(0, 1)
            ax_cal.set_ylim(0, 1)
            ax_cal.legend(loc="upper left", fontsize=8)
        else:
            ax_cal.text(0.5, 0.5, "needs a ground truth" if result is not None else
                        "run a reconstruction", ha="center", va="center", color=fg, fontsize=9,
                        transform=ax_cal.transAxes)
        ax_cal.set_xlabel("nominal coverage", fontsize=8)
        ax_cal.set_ylabel("observed coverage", fontsize=8)
        ax_cal.set_title("calibration", fontsize=9)
        self._plot_trace(ax_em, [] if result is None else result.em_trace)
        fig.tight_layout()
        self.canvas.draw_idle()

    #: EM-trace keys of the per-block prior variances (first found is drawn).
    VARIANCE_KEYS = ("a_b", "a", "variances")

    def _plot_trace(self, ax, trace: list[dict]) -> None:
        """Per-block prior variances (thin lines) and the noise variance σ² (dashed)."""
        fg = self._colors["fg"]
        ax.set_title("EM trace", fontsize=9)
        ax.set_xlabel("EM step", fontsize=8)
        trace = [t for t in trace if t.get("slice", 0) == 0]   # a stack: its first slice
        key = next((k for k in self.VARIANCE_KEYS if trace and k in trace[0]), None)
        if key is None and not (trace and "sigma2" in trace[0]):
            ax.text(0.5, 0.5, "no EM steps", ha="center", va="center", color=fg, fontsize=9,
                    transform=ax.transAxes)
            return
        steps = [t.get("step", i) for i, t in enumerate(trace)]
        if key is not None:
            rows = [np.atleast_1d(np.asarray(t.get(key) or [], dtype=float)) for t in trace]
            width = max(r.size for r in rows)
            arr = np.full((len(rows), width), np.nan)
            for i, r in enumerate(rows):
                arr[i, :r.size] = r
            ax.plot(steps, arr, lw=1, alpha=0.8)
            ax.plot([], [], lw=1, color="0.6", label=f"prior variance per block ({width})")
        if "sigma2" in trace[0]:
            sigma2 = np.array([np.nan if t.get("sigma2") is None else t["sigma2"]
                               for t in trace], dtype=float)
            ax.plot(steps, sigma2, "--", color=fg, lw=1.5, label="noise variance σ²")
        ax.set_yscale("log")
        ax.set_xticks(steps)
        ax.legend(fontsize=7, loc="best")
