"""The result figure shows the std's parts when the result carries a model-error term."""

from __future__ import annotations

import numpy as np
import pytest

from ctuq.data.io import Result


def _result(with_parts: bool) -> Result:
    rng = np.random.default_rng(0)
    truth = rng.random((16, 16)).astype(np.float32)
    post = np.full((16, 16), 0.02, np.float32)
    model = np.full((16, 16), 0.05 if with_parts else 0.0, np.float32)
    return Result(reconstruction=truth + 0.03 * rng.standard_normal((16, 16)).astype(np.float32),
                  std=np.sqrt(post**2 + model**2), posterior_std=post, model_error_std=model,
                  ground_truth=truth, em_trace=[{"step": 0, "a_b": [1e-3]}])


@pytest.mark.parametrize("with_parts, titles", [
    (True, ["std (total)", "posterior std", "model-error std"]),
    (False, ["posterior std"])])
def test_std_panels(tmp_path, monkeypatch, with_parts, titles):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ctuq.app import figures

    seen = []
    monkeypatch.setattr(plt, "close", lambda fig: seen.extend(
        ax.get_title() for ax in fig.axes))
    path = figures.result_figure(tmp_path / "r.png", _result(with_parts))
    assert path.exists() and path.stat().st_size > 0
    assert [t for t in seen if "std" in t] == titles
