"""The educated warm start: dip.warm_start, the shipped weights, the pretraining, the sweep's summary."""

import numpy as np
import pytest
import torch

from ctuq.data.splits import FAMILIES
from ctuq.errors import InputError
from ctuq.models.unet import UNetConfig, build_unet, unet_preset
from ctuq.recon import presets
from ctuq.recon.dip import DIPConfig, fit_dip, load_weights, make_net_input, save_weights
from ctuq.recon.warm_start import WEIGHTS_DIR, resolve_warm_start, shipped_presets

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2))


def test_warm_start_values_and_their_errors(tmp_path):
    assert resolve_warm_start("none", "dip-64") is None
    assert resolve_warm_start(" None ", "dip-64") is None
    with pytest.raises(InputError, match="no shipped warm-start weights") as err:
        resolve_warm_start("shipped", "reference-large")
    assert err.value.field == "dip.warm_start"
    with pytest.raises(InputError, match="no such") as err:
        resolve_warm_start(str(tmp_path / "missing.pt"), "dip-64")
    assert err.value.file and err.value.field == "dip.warm_start"
    with pytest.raises(InputError, match="warm_start"):
        DIPConfig(warm_start="")
    with pytest.raises(InputError, match="either init_weights or warm_start"):
        DIPConfig(init_weights="a.pt", warm_start="shipped")
    # a TOML/dict round trip keeps the setting
    cfg = DIPConfig.preset_defaults("dip-64", warm_start="shipped")
    assert DIPConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "unet"}) \
        .warm_start == "shipped"


def test_warm_start_defaults_apply_only_with_a_warm_start(monkeypatch):
    monkeypatch.setitem(presets.WARM_START_DEFAULTS, "dip-64", {"lr": 1.5e-3, "iterations": 77})
    cold = DIPConfig.preset_defaults("dip-64")
    assert (cold.lr, cold.iterations) == (presets.DIP_DEFAULTS["dip-64"]["lr"],
                                          presets.DIP_DEFAULTS["dip-64"]["iterations"])
    warm = DIPConfig.preset_defaults("dip-64", warm_start="shipped")
    assert (warm.lr, warm.iterations) == (1.5e-3, 77)
    mine = DIPConfig.preset_defaults("dip-64", warm_start="shipped", iterations=5)
    assert (mine.lr, mine.iterations) == (1.5e-3, 5)   # the user's value wins


def test_warm_start_from_a_file_begins_at_its_weights(tmp_path):
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import digits
    from ctuq.data.simulate import simulate_sinogram

    op = RayTransform(Geometry.parallel(16, 10), backend="matrix", device="cpu")
    y, _ = simulate_sinogram(digits(1, size=16, seed=0)[0], op, 0.05, seed=1)
    net = build_unet(TINY, seed=5)
    path = tmp_path / "w.pt"
    save_weights(net, path)
    cfg = DIPConfig(unet=TINY, iterations=1, lr=1e-2, tv_weight=0.1, device="cpu",
                    warm_start=str(path))
    res = fit_dip(y, op, cfg)
    with torch.no_grad():
        expected = net(make_net_input(torch.as_tensor(y), op, cfg, "cpu"))
    # the first (and only) iterate is the file's network, not the seed's
    assert torch.allclose(res.reconstruction, expected.reshape(16, 16), atol=1e-6)


@pytest.mark.skipif(not shipped_presets(), reason="no weights shipped")
@pytest.mark.parametrize("preset", shipped_presets() or ["none"])
def test_shipped_weights_fit_their_preset_and_post_process_an_unseen_fbp(preset):
    """On a validation-split scan (never seen in pretraining) the shipped net beats the FBP."""
    from ctuq.bench.cases import simulate
    from ctuq.recon.predictive import psnr

    assert (WEIGHTS_DIR / f"{preset}.pt").stat().st_size < 400_000
    net = load_weights(build_unet(unet_preset(preset), seed=0),
                       resolve_warm_start("shipped", preset)).eval()
    size = int(preset.split("-")[1])
    gains = []
    for family in ("ellipses", "digits"):
        scan = simulate({"split": "validation", "family": family, "index": 7, "size": size,
                         "n_angles": 60, "noise": 0.05}, offset=0)
        fbp = scan.op.fbp(scan.y)
        with torch.no_grad():
            out = net(fbp.reshape(1, 1, size, size))[0, 0]
        gains.append(psnr(scan.truth, out) - psnr(scan.truth, fbp))
    assert min(gains) > 1.0, gains


def test_save_half_round_trip(tmp_path):
    from ctuq.bench.pretrain import save_half

    net = build_unet(TINY, seed=3)
    save_half(net, tmp_path / "h.pt")
    back = load_weights(build_unet(TINY, seed=4), tmp_path / "h.pt")
    assert all(v.dtype == torch.float32 for v in back.state_dict().values()
               if v.is_floating_point())
    for (k, a), b in zip(net.state_dict().items(), back.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4), k   # float16 precision
    assert (tmp_path / "h.pt").stat().st_size < 0.7 * _size_of_full(net, tmp_path)


def _size_of_full(net, tmp_path):
    save_weights(net, tmp_path / "f.pt")
    return (tmp_path / "f.pt").stat().st_size


def test_training_pairs_are_seeded_and_from_the_tuning_split():
    from ctuq.bench.pretrain import training_pairs

    fbp, truth, info = training_pairs(28, 6, seed=1, conditions=[(20, 0.05)])
    again, _, info2 = training_pairs(28, 6, seed=1, conditions=[(20, 0.05)])
    assert fbp.shape == truth.shape == (6, 1, 28, 28)
    assert torch.equal(fbp, again) and info == info2
    assert {i["family"] for i in info} <= set(FAMILIES["tuning"])
    assert len({(i["family"], i["index"]) for i in info}) == 6          # no repeats
    assert not torch.equal(fbp, training_pairs(28, 6, seed=2, conditions=[(20, 0.05)])[0])


def test_pretraining_lowers_the_loss():
    from ctuq.bench.pretrain import pretrain, training_pairs

    fbp, truth, _ = training_pairs(28, 8, seed=0, conditions=[(20, 0.05)])
    _, rec = pretrain("reference-28", fbp, truth, steps=40, batch=4, lr=3e-3,
                      report_every=10, val=(fbp[:2], truth[:2]))
    mse = [h["train_mse"] for h in rec["history"]]
    assert len(mse) == 4 and mse[-1] < 0.5 * mse[0]


def test_sweep_cases_and_summary():
    from ctuq.bench.dip_vs_tv import summarise_sweep, sweep_cases

    cases = sweep_cases(64, 2)
    assert {c["split"] for c in cases} == {"validation"}
    assert len(cases) == 2 * len(FAMILIES["validation"])
    assert {c["condition"] for c in cases if c["index"] == 0} == {"30 angles, 1% noise"}
    assert {c["condition"] for c in cases if c["index"] == 1} == {"60 angles, 5% noise"}
    tv = [{"id": f"c{i}", "tv_best": {"psnr": 30.0 + i}, "tv_default": {"psnr": 29.0 + i}}
          for i in range(3)]
    dip = [{"case": f"c{i}", "variant": "v", "size": 64, "family": "a" if i else "b",
            "changes": {}, "dip_tv": {"psnr": p, "ssim": 0.9, "time_s": 1.0}}
           for i, p in enumerate([31.0, 30.0, 33.0])]
    s = summarise_sweep(tv, dip)["64"]["v"]
    assert s["all"]["dip_minus_tv_best"] == pytest.approx(np.mean([1.0, -1.0, 1.0]))
    assert s["all"]["dip_minus_tv_default"] == pytest.approx(np.mean([2.0, 0.0, 2.0]))
    assert s["all"]["dip_at_least_tv_best"] == 2
    assert s["families"]["a"]["dip_minus_tv_best_min"] == pytest.approx(-1.0)
