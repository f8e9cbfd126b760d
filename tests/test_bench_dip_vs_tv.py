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
    # FBP and TV see the data as simulated; only the DIP fits them divided by their scale
    from ctuq.bench.cases import simulate
    from ctuq.bench.scores import image_metrics
    from ctuq.recon.baselines import fbp_reconstruction

    scan = simulate(case, offset=0)
    assert row["data_scale"] != 1.0
    assert row["methods"]["fbp"]["psnr"] == pytest.approx(
        image_metrics(scan.truth, fbp_reconstruction(scan.y, scan.op))["psnr"])
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


def test_heldout_variant_traces_the_left_out_residual_and_stops_at_its_minimum(bench):
    import dataclasses

    import torch

    from ctuq.bench.cases import simulate
    from ctuq.data.operators import RayTransform
    from ctuq.recon.dip import DIPConfig
    from ctuq.recon.model_error.heldout import heldout_fit, heldout_split
    from ctuq.recon.scaling import data_scale

    case = bench.sweep_cases(28, 1, families=["digits"])[0]
    row = bench.run_dip_variant_case(case, {"iterations": 30, "heldout_every": 6},
                                     monitor_every=10)
    trace = row["trace"]
    assert [t[0] for t in trace] == [10, 20, 30] and all(len(t) == 4 for t in trace)
    stop = min(trace, key=lambda t: t[3])
    assert row["heldout_stop"] == {"iteration": stop[0], "psnr": stop[2],
                                   "peak_psnr": max(t[2] for t in trace)}
    assert row["changes"] == {"iterations": 30, "heldout_every": 6}
    # the traced residual is that of the left-out rows (20 angles: every 3rd, 7 out), at
    # the fit's scale; the last traced view is the returned reconstruction
    scan = simulate(case, offset=0)
    s = data_scale(scan.y, scan.op)
    assert row["normalized"] and row["data_scale"] == pytest.approx(s)
    mask = heldout_split(scan.op.geometry.n_angles, 6, 7)
    assert mask.sum() == 7
    op_out = RayTransform(dataclasses.replace(scan.op.geometry,
                                              angles=scan.op.geometry.angles[mask]))
    assert trace[-1][2] == pytest.approx(row["dip_tv"]["psnr"], abs=1e-3)
    cfg = DIPConfig.preset_defaults("reference-28", device="cpu", progress_every=10,
                                    iterations=30)
    _, dip = heldout_fit(scan.y / s, scan.op, cfg, every=6, min_out=7, noise_std=scan.sigma / s)
    y_out = torch.as_tensor(scan.y)[torch.as_tensor(mask)] / s
    with torch.no_grad():
        expected = float(((op_out(dip.reconstruction) - y_out) ** 2).mean())
    assert trace[-1][3] == pytest.approx(expected, rel=1e-4)
    # the held-out fit is not the fit on all angles
    full = bench.run_dip_variant_case(case, {"iterations": 30}, monitor_every=30)
    assert full["dip_tv"]["psnr"] != pytest.approx(row["dip_tv"]["psnr"], abs=1e-3)


def test_unnormalized_variant_fits_the_data_as_simulated(bench):
    case = bench.sweep_cases(28, 1, families=["digits"])[0]
    plain = bench.run_dip_variant_case(case, {"iterations": 10}, monitor_every=10,
                                       normalize=False)
    scaled = bench.run_dip_variant_case(case, {"iterations": 10}, monitor_every=10)
    assert plain["data_scale"] == 1.0 and not plain["normalized"]
    assert scaled["data_scale"] != 1.0
    # different data given to the same seeded fit: different images
    assert plain["dip_tv"]["psnr"] != pytest.approx(scaled["dip_tv"]["psnr"], abs=1e-3)
    s = bench.summarise_sweep([], [{**plain, "variant": "v"}])
    assert s == {"28": {}}  # no TV row for the case: nothing is compared


def test_architecture_variant_fits_the_changed_network_and_records_the_change(bench, monkeypatch):
    import json

    from ctuq.models import count_parameters
    from ctuq.models.unet import UNet
    from ctuq.recon import dip as dip_module

    seen = []
    real = dip_module.fit_dip

    def spy(y, op, cfg, **kw):
        seen.append(cfg.unet_config())
        return real(y, op, cfg, **kw)

    monkeypatch.setattr(dip_module, "fit_dip", spy)
    case = bench.sweep_cases(28, 1, families=["digits"])[0]
    changes = {"iterations": 5, "unet": {"channels": [8, 8, 8]}}
    row = bench.run_dip_variant_case(case, changes, monitor_every=5)
    net = seen[-1]
    assert net.channels == (8, 8, 8)  # the change, on the size's preset otherwise
    assert net.scales == 3 and net.skip_channels == (0, 4, 4)
    assert count_parameters(UNet(net)) < count_parameters(UNet(net.with_(channels=(32,) * 3)))
    assert row["changes"] == changes  # as given: the row stays JSON
    json.dumps(row)
