"""ctuq.bench.dip_vs_tv's fitted cases: the PSNR trace and the iterations to reach TV."""

import pytest

from ctuq.bench import dip_vs_tv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bench():
    return dip_vs_tv


def test_fitted_case_reports_first_traced_iteration_at_tv_psnr(bench, monkeypatch, tmp_path):
    from ctuq.recon import presets

    # a short fit of the 28² preset: the trace, not the quality, is under test
    monkeypatch.setitem(presets.DIP_DEFAULTS, "reference-28",
                        {**presets.DIP_DEFAULTS["reference-28"], "iterations": 60})
    case = bench.fit_cases([28], 1, 20, 0.05)[3]  # one family's case (digits)
    assert case["split"] == "test" and case["size"] == 28
    row = bench.run_fit_case(case, monitor_every=20)
    trace = row["dip_psnr_trace"]
    assert [t[0] for t in trace] == [20, 40, 60]
    assert all(b[1] >= a[1] for a, b in zip(trace, trace[1:]))  # seconds grow
    # the last traced view is the returned reconstruction
    assert trace[-1][2] == pytest.approx(row["methods"]["dip_tv"]["psnr"], abs=1e-3)
    tv = row["methods"]["tv"]["psnr"]
    reached = [t for t in trace if t[2] >= tv]
    if reached:
        assert row["dip_iterations_to_tv_psnr"] == reached[0][0]
    else:
        assert row["dip_iterations_to_tv_psnr"] is None
    assert row["dip_minus_tv_psnr"] == pytest.approx(row["methods"]["dip_tv"]["psnr"] - tv)
    s = bench.summarise([row])
    assert s["reached_tv_psnr"] == int(bool(reached))
    assert s["images"] == 1 and s["dip_at_least_tv_psnr"] == int(row["dip_minus_tv_psnr"] >= 0)


def test_fit_cases_cover_every_test_family_before_a_second_image(bench):
    from ctuq.data.splits import FAMILIES

    cs = bench.fit_cases([256], 2, 60, 0.05)
    n = len(FAMILIES["test"])
    assert [c["family"] for c in cs[:n]] == list(FAMILIES["test"])
    assert {c["index"] for c in cs[:n]} == {0} and {c["index"] for c in cs[n:]} == {1}
    assert len({c["id"] for c in cs}) == 2 * n


def test_stored_case_scores_tv_at_its_default_and_its_best_weight(bench, tmp_path):
    import numpy as np

    from ctuq.bench.cases import _case, simulate

    row = {**_case("test", "digits", 0, 28, 20, 0.05), "preset": "reference-28",
           "times_s": {"dip": 1.0}}
    truth = simulate(row).truth
    blurred = 0.5 * (truth + np.roll(truth, 1, axis=0))      # a stand-in for a DIP image
    np.savez(tmp_path / (row["id"].replace("/", "_") + ".npz"), truth=truth, x_hat=blurred)
    out = bench.run_case(row, tmp_path)
    m = out["methods"]
    # the default weight is one of the weights tried: the best is at least as good
    assert m["tv_best"]["factor"] in bench.TV_FACTORS and m["tv_best"]["psnr"] >= m["tv"]["psnr"]
    assert out["dip_minus_tv_best_psnr"] == pytest.approx(m["dip_tv"]["psnr"] - m["tv_best"]["psnr"])
    s = bench.summarise([out])
    assert s["tv_best"]["psnr"] == pytest.approx(m["tv_best"]["psnr"])
    assert s["dip_at_least_tv_best_psnr"] == int(out["dip_minus_tv_best_psnr"] >= 0)
    # a missing array is skipped, not an error
    assert bench.run_case({**row, "id": "test/digits/9/28/20/0.05"}, tmp_path) is None
