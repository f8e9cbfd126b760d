"""IVON-DIP (ctuq.recon.ivon_dip): end to end on a 28² digit, the posterior's settings, errors."""

import json
import math

import pytest
import torch

from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import InputError
from ctuq.models.unet import UNetConfig
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.ivon_dip import IVONDIPConfig, IVONDIPResult, fit_ivon_dip

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digit_scan():
    op = RayTransform(Geometry.parallel(28, 20))
    x = digits(1, seed=0)[0]
    y, sigma = simulate_sinogram(x, op, 0.05, seed=1)
    return op, x, y, sigma


def test_end_to_end_few_iterations(digit_scan):
    op, x, y, sigma = digit_scan
    cfg = IVONDIPConfig(start="scratch", iterations=15, n_samples=6, keep_samples=3,
                        ess=None, temperature=2.0, prior_precision=4.0)
    events = []
    res = fit_ivon_dip(y, op, cfg, noise_std=sigma, progress=lambda **kw: events.append(kw))
    assert isinstance(res, IVONDIPResult)
    assert res.reconstruction.shape == res.std.shape == res.sample_mean.shape == (28, 28)
    assert res.samples.shape == (3, 28, 28)
    assert torch.isfinite(res.std).all() and bool((res.std >= 0).all())
    assert float(res.std.mean()) > 0 and float((res.std > 0).double().mean()) > 0.5
    # the sample mean and std are those of the kept samples' population
    assert torch.isfinite(res.sample_mean).all()
    # the posterior IVON was given: ess = d_y / T, prior precision α = ess · weight_decay
    d_y = y.numel()
    assert res.settings.ess == pytest.approx(d_y / 2.0)
    assert res.settings.prior_precision == pytest.approx(4.0)
    assert res.posterior.mean.numel() == sum(p.numel() for p in res.model.parameters())
    # the model holds the mean weights; its output is the reconstruction up to the
    # pre-sigmoid clamp (off for the reconstruction and the samples by default)
    with torch.no_grad():
        assert torch.allclose(res.model(res.net_input)[0, 0], res.reconstruction, atol=2e-4,
                              rtol=0)
    clamped = fit_ivon_dip(y, op, cfg.with_(unclamped=False), noise_std=sigma)
    with torch.no_grad():
        assert torch.equal(clamped.model(clamped.net_input)[0, 0], clamped.reconstruction)
    assert res.loss_history["loss"].shape == (15,)
    assert res.noise_std == sigma and res.tv_weight > 0
    json.dumps(res.summary())  # JSON-safe settings and timings
    stages = {e["stage"] for e in events}
    assert {"ivon_dip", "ivon_samples"} <= stages


def test_seeded_and_noise_estimated(digit_scan):
    op, _, y, sigma = digit_scan
    cfg = IVONDIPConfig(start="scratch", iterations=5, n_samples=3, keep_samples=0)
    a = fit_ivon_dip(y, op, cfg, noise_std=sigma)
    b = fit_ivon_dip(y, op, cfg, noise_std=sigma)
    assert torch.equal(a.reconstruction, b.reconstruction) and torch.equal(a.std, b.std)
    from ctuq.recon.baselines import estimate_noise_std

    est = fit_ivon_dip(y, op, cfg)  # σ estimated from the sinogram
    assert est.noise_std == pytest.approx(estimate_noise_std(y))
    assert est.settings.ess == a.settings.ess == 8.0  # σ enters the loss, not ess
    assert a.settings.prior_precision == pytest.approx(1.0)


def test_start_from_a_dip_fit(digit_scan):
    op, _, y, sigma = digit_scan
    dcfg = DIPConfig(iterations=40)
    adam = fit_dip(y, op, dcfg, noise_std=sigma)
    # one tiny step: IVON's mean stays at the Adam weights
    cfg = IVONDIPConfig(dip=dcfg, start="dip", iterations=1, lr=1e-9, n_samples=2,
                        keep_samples=0)
    res = fit_ivon_dip(y, op, cfg, noise_std=sigma, dip_result=adam)
    assert res.dip is adam
    assert torch.allclose(res.reconstruction, adam.reconstruction, atol=1e-5)
    # a fit of another architecture is refused
    other = fit_dip(y, op, DIPConfig(iterations=1, unet=UNetConfig(scales=2, channels=(8, 8),
                                                                   skip_channels=(0, 2))),
                    noise_std=sigma)
    with pytest.raises(InputError) as err:
        fit_ivon_dip(y, op, cfg, noise_std=sigma, dip_result=other)
    assert err.value.field == "dip_result"


def test_unclamped_samples_keep_a_spread_where_the_fit_saturates(digit_scan):
    # after a real Adam fit the digit's background sits below the ±9 pre-sigmoid clamp:
    # clamped, every weight sample gives sigmoid(−9) there and the std is exactly 0
    op, x, y, sigma = digit_scan
    dcfg = DIPConfig(iterations=300)
    adam = fit_dip(y, op, dcfg, noise_std=sigma)
    cfg = IVONDIPConfig(dip=dcfg, start="dip", iterations=1, lr=1e-9, n_samples=8,
                        keep_samples=0, hess_init=1e4, ess=None)  # tiny spread
    on = fit_ivon_dip(y, op, cfg.with_(unclamped=False), noise_std=sigma, dip_result=adam)
    off = fit_ivon_dip(y, op, cfg, noise_std=sigma, dip_result=adam)
    zero = on.std == 0
    assert float(zero.double().mean()) > 0.02  # 5 % here; 72 % on a rectangles phantom
    assert bool((off.std > 0).all())
    assert torch.allclose(on.reconstruction[zero], torch.sigmoid(torch.tensor(-9.0)))
    # the two agree where the clamp is not active: away from it (a pixel near ±9 may
    # be clamped in some samples and not in others)
    away = torch.logit(off.reconstruction.double()).abs() < 8.5
    assert float(away.double().mean()) > 0.5
    assert torch.allclose(on.std[away], off.std[away], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("changes, field", [
    ({"start": "adam"}, "start"), ({"temperature": 0.0}, "temperature"),
    ({"prior_precision": -1.0}, "prior_precision"), ({"n_samples": 1}, "n_samples"),
    ({"keep_samples": -1}, "keep_samples"), ({"hess_init": 0.0}, "hess_init"),
    ({"iterations": 0}, "iterations"), ({"ess": 0.0}, "ess")])
def test_config_refuses_bad_values(changes, field):
    with pytest.raises(InputError) as err:
        IVONDIPConfig(**changes)
    assert err.value.field == field


def test_bad_sinogram_and_noise(digit_scan):
    op, _, y, _ = digit_scan
    cfg = IVONDIPConfig(start="scratch", iterations=1, n_samples=2)
    with pytest.raises(InputError):
        fit_ivon_dip(y[:, :-1], op, cfg, noise_std=0.1)
    with pytest.raises(InputError) as err:
        fit_ivon_dip(y, op, cfg, noise_std=0.0)
    assert err.value.field == "noise_std"


def test_ess_sets_the_temperature():
    cfg = IVONDIPConfig(ess=8.0, temperature=3.0, prior_precision=2.0)
    s = cfg.settings(800)
    assert cfg.effective_temperature(800) == 100.0  # ess wins over temperature
    assert s.ess == 8.0 and s.prior_precision == pytest.approx(2.0)
    s2 = cfg.with_(ess=None).settings(800)
    assert s2.ess == pytest.approx(800 / 3.0) and s2.prior_precision == pytest.approx(2.0)


def test_config_round_trip():
    cfg = IVONDIPConfig(dip=DIPConfig(iterations=5, tv_weight=0.1), temperature=3.0,
                        clip_radius=math.inf, start="dip")
    d = json.loads(json.dumps(cfg.to_dict()))
    back = IVONDIPConfig.from_dict(d)
    assert back.temperature == 3.0 and back.start == "dip" and math.isinf(back.clip_radius)
    assert back.dip.tv_weight == 0.1 and back.dip.iterations == 5
    with pytest.raises(InputError):
        IVONDIPConfig.from_dict({"temprature": 1.0})


@pytest.mark.slow
def test_defaults_beat_fbp_on_a_digit(digit_scan):
    from ctuq.recon.baselines import fbp_reconstruction
    from ctuq.recon.predictive import psnr

    op, x, y, sigma = digit_scan
    res = fit_ivon_dip(y, op, IVONDIPConfig(n_samples=16), noise_std=sigma)
    fbp = psnr(x, fbp_reconstruction(y, op))
    assert psnr(x, res.reconstruction) > fbp + 3.0
    assert torch.isfinite(res.std).all() and float(res.std.mean()) > 0
    # the spread is not absurd: mean std below the image's range and above 1e-4
    assert 1e-4 < float(res.std.mean()) < 0.2
    assert not math.isnan(float(res.loss_history["loss"][-1]))
