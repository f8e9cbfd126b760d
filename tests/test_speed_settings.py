"""The speed settings: EM patience, the held-out fit's share of the iterations, the
DIP fit continued from the held-out fit.

Each setting's old value must give the old computation; the new values must
do what they say (fewer steps, fewer iterations) without the held-out fit
ever seeing the held-out rows.
"""

import pytest
import torch

from ctuq.errors import InputError
from ctuq.posterior import EMOptions, Linearization
from ctuq.recon.evidence import fit_posterior

from toy_problem import toy_problem

pytestmark = pytest.mark.usefixtures("one_thread")


def _fit(em: EMOptions):
    toy = toy_problem(16, 12, fit_steps=30)
    lin = Linearization(toy.model, toy.net_input)
    return fit_posterior(lin, toy.op, toy.y, toy.noise_std**2, prior="gprior", em=em)


def test_em_patience_waits_for_that_many_calm_steps_and_one_is_the_old_rule():
    calm = dict(n_samples=2, em_steps=6, em_tol=1e6, seed=0)  # every step below tolerance
    one = _fit(EMOptions(**calm))
    assert EMOptions().em_patience == 1
    assert one.info["em_steps"] == 1 and one.info["converged"]
    three = _fit(EMOptions(**calm, em_patience=3))
    assert three.info["em_steps"] == 3 and three.info["converged"] and len(three.trace) == 4
    # the same draws: the first steps agree exactly, the patience only adds steps
    for a, b in zip(one.trace, three.trace):
        assert a["a_b"] == b["a_b"] and a["sigma2"] == b["sigma2"]
    never = _fit(EMOptions(n_samples=2, em_steps=2, em_tol=0.0, seed=0))
    assert never.info["em_steps"] == 2 and not never.info["converged"]


def test_em_patience_is_checked_and_reaches_the_engine():
    from ctuq.recon.config import UncertaintyConfig

    with pytest.raises(InputError) as err:
        EMOptions(em_patience=0)
    assert err.value.field == "em_patience"
    with pytest.raises(InputError) as err:
        UncertaintyConfig(laplace={"em_patience": 0})
    assert "em_patience" in err.value.field
    assert UncertaintyConfig(em_patience=2).laplace.em_patience == 2
    assert UncertaintyConfig().laplace.em_patience == 1


def test_heldout_iterations_one_keeps_the_fit_and_a_fraction_shortens_it():
    from ctuq.recon.dip import DIPConfig
    from ctuq.recon.model_error.terms import heldout_config

    cfg = DIPConfig.for_image_size(64)
    assert heldout_config(cfg, 1.0) is cfg
    half = heldout_config(cfg, 0.5)
    assert half.iterations == cfg.iterations // 2
    assert half.with_(iterations=cfg.iterations) == cfg  # nothing else changes
    assert heldout_config(cfg.with_(iterations=3), 0.1).iterations == 1


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5])
def test_heldout_iterations_outside_zero_one_is_refused(bad):
    from ctuq.recon.config import UncertaintyConfig

    with pytest.raises(InputError) as err:
        UncertaintyConfig(heldout_iterations=bad)
    assert err.value.field == "uncertainty.heldout_iterations"


def test_short_heldout_fit_runs_its_share_and_never_sees_the_held_out_rows(monkeypatch):
    from types import SimpleNamespace

    from ctuq.recon.config import UncertaintyConfig
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.model_error import heldout as ho
    from ctuq.recon.model_error.terms import HeldoutTerm

    toy = toy_problem(16, 12, fit_steps=30)
    cfg = DIPConfig.for_image_size(16, iterations=20, progress_every=10**6, device="cpu")
    fit = fit_dip(toy.y, toy.op, cfg, noise_std=toy.noise_std)
    seen = []
    import ctuq.recon.dip as dip_module  # heldout_fit imports fit_dip from there when called

    original = dip_module.fit_dip

    def watched(y, op, config, **kw):
        seen.append((config.iterations, y.clone()))
        return original(y, op, config, **kw)

    var = torch.full((16, 16), 1e-4, dtype=torch.float64)
    # the noise as given: a bare problem has no noise model for the fit's excess
    term = HeldoutTerm(UncertaintyConfig(heldout_iterations=0.5, heldout_every=4,
                                         heldout_min_out=0, heldout_prior_width=0,
                                         heldout_noise="given"), "x")
    noise = SimpleNamespace(ray_variance=None)  # the scalar noise model
    problem = SimpleNamespace(y=toy.y, op=toy.op, noise=noise)
    monkeypatch.setattr(dip_module, "fit_dip", watched)
    coeffs, v, image = term.compute(problem, fit, var, toy.noise_std**2)
    y2 = toy.y.clone()
    mask = ho.heldout_split(12, 4)
    y2[torch.as_tensor(mask)] += 10.0  # change only what is left out
    term.compute(SimpleNamespace(y=y2, op=toy.op, noise=noise), fit, var, toy.noise_std**2)
    (it1, y_in1), (it2, y_in2) = seen
    assert it1 == it2 == 10 and torch.equal(y_in1, y_in2)  # the kept rows only
    assert v.shape == (16, 16) and torch.isfinite(v).all()
    assert coeffs.info["heldout_angles"] == int(mask.sum())
    assert torch.equal(image, fit.reconstruction.detach())  # no step: the DIP output


def test_dip_from_heldout_continues_from_the_held_out_fit_which_never_saw_its_rows(
        monkeypatch):
    from types import SimpleNamespace

    import ctuq.recon.dip as dip_module
    from ctuq.recon.config import UncertaintyConfig
    from ctuq.recon.dip import DIPConfig
    from ctuq.recon.model_error import heldout as ho
    from ctuq.recon.model_error.shared import dip_fit
    from ctuq.recon.model_error.terms import HeldoutTerm

    toy = toy_problem(16, 12, fit_steps=30)
    cfg = DIPConfig.for_image_size(16, iterations=20, progress_every=10**6, device="cpu")
    unc = UncertaintyConfig(dip_from_heldout=0.25, heldout_every=4, heldout_min_out=0,
                            heldout_prior_width=0, heldout_noise="given")
    calls = []
    original = dip_module.fit_dip

    def watched(y, op, config, **kw):
        calls.append((config.iterations, y.shape[0], kw.get("init_state")))
        out = original(y, op, config, **kw)
        calls[-1] += (out,)
        return out

    monkeypatch.setattr(dip_module, "fit_dip", watched)
    problem = SimpleNamespace(y=toy.y, op=toy.op, dip=cfg, uncertainty=unc,
                              noise=SimpleNamespace(std=toy.noise_std, ray_variance=None))
    term = HeldoutTerm(unc, "x")
    fit = dip_fit(problem, term)
    (it_held, rows_held, init_held, held), (it_all, rows_all, init_all, main) = calls
    n_out = int(ho.heldout_split(12, 4).sum())
    assert (it_held, rows_held, init_held) == (20, 12 - n_out, None)  # seeded start
    assert (it_all, rows_all) == (5, 12) and main is fit
    assert all(torch.equal(init_all[k], v) for k, v in held.state_dict.items())
    # the held-out term reuses that fit: no third fit
    var = torch.full((16, 16), 1e-4, dtype=torch.float64)
    coeffs, _, _ = term.compute(problem, fit, var, toy.noise_std**2)
    assert len(calls) == 2 and coeffs.info["heldout_angles"] == n_out
    # 0 (the default) is the old single fit from the seeded start
    calls.clear()
    old = dip_fit(SimpleNamespace(**{**vars(problem), "uncertainty": UncertaintyConfig()}),
                  HeldoutTerm(UncertaintyConfig(), "x"))
    assert [(c[0], c[1], c[2]) for c in calls] == [(20, 12, None)]
    assert old.config == cfg


def test_continued_fit_runs_the_tail_of_the_full_fits_learning_rate_schedule():
    from ctuq.recon.dip import DIPConfig, lr_factor
    from ctuq.recon.model_error.shared import continued_config

    full = DIPConfig.for_image_size(64, iterations=1000, lr=1e-2, lr_min_factor=0.01,
                                    warmup=20)
    tail = continued_config(full, 0.3)
    assert tail.iterations == 300 and tail.warmup == 0
    lr_full = [full.lr * lr_factor(full)(i) for i in range(1000)]
    lr_tail = [tail.lr * lr_factor(tail)(i) for i in range(300)]
    # starts where the full fit is 300 steps before its end (not at the peak),
    # ends at the same floor, and decays monotonically in between
    assert abs(lr_tail[0] - lr_full[700]) < 1e-12 and lr_tail[0] < 0.3 * full.lr
    assert abs(tail.lr * tail.lr_min_factor - full.lr * full.lr_min_factor) < 1e-12
    assert all(a >= b for a, b in zip(lr_tail, lr_tail[1:]))
    # a constant schedule continues at its rate
    const = continued_config(full.with_(lr_schedule="constant"), 0.3)
    assert const.lr == full.lr
