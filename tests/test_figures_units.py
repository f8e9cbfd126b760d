"""The result figure's colour bars name the images' unit (``ctuq demo``'s demo.png)."""

from __future__ import annotations

import numpy as np

from ctuq.data.io import Result


def test_colour_bars_carry_the_unit(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctuq.app import figures

    rng = np.random.default_rng(0)
    truth = rng.random((16, 16)).astype(np.float32)
    post = np.full((16, 16), 0.02, np.float32)
    model = np.full((16, 16), 0.05, np.float32)
    r = Result(reconstruction=truth, std=np.sqrt(post**2 + model**2), posterior_std=post,
               model_error_std=model, ground_truth=truth + 0.01, units="1/mm")
    labels = []
    monkeypatch.setattr(plt, "close", lambda fig: labels.extend(
        ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"))
    figures.result_figure(tmp_path / "r.png", r)
    assert labels == ["1/mm"] * 4, labels      # total, posterior, model-error std, |error|
