"""IVON classifier (ctuq.classify.ivon): the MC predictive and its metrics against a hand-computed case."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from ctuq.classify.ivon import (
    DEFAULT_PREDICTIVE_SAMPLES,
    ivon_logit_samples,
    ivon_predictive,
    mean_predictive,
    train_ivon,
)
from ctuq.errors import InputError
from ctuq.models.ivon import DiagonalGaussian
from ctuq.classify.metrics import classification_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

MU, S = 0.8, 1.5  # the logit difference b0 − b1 ~ N(MU, S²)


def bias_only_model():
    """``Linear(1, 2)`` on the input 0: logits = bias; q puts N(MU, S²) on b0, b1 = 0 fixed."""
    net = nn.Linear(1, 2).double()
    # parameters() order: weight [2, 1], bias [2]
    q = DiagonalGaussian(torch.tensor([0.3, -0.2, MU, 0.0], dtype=torch.float64),
                         torch.tensor([0.5, 0.5, S**2, 0.0], dtype=torch.float64))
    return net, q


def hand_probability() -> float:
    """P(class 0) = E[sigmoid(b)], b ~ N(MU, S²), by 80-point Gauss–Hermite quadrature."""
    z, w = np.polynomial.hermite_e.hermegauss(80)
    return float(np.sum(w / np.sqrt(2 * np.pi) / (1 + np.exp(-(MU + S * z)))))


def test_predictive_and_metrics_match_hand_computation():
    net, q = bias_only_model()
    x = torch.zeros(3, 1, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    n = 8192
    probs = ivon_predictive(net, q, x, n, seed=0)
    p = hand_probability()
    assert 0.6 < p < 0.7  # the spread pulls sigmoid(0.8) = 0.69 towards 1/2
    tol = 4 * 0.5 / math.sqrt(n)  # 4 MC standard errors (sd of a probability <= 1/2)
    assert torch.allclose(probs[:, 0], torch.full((3,), p, dtype=torch.float64), atol=tol)
    assert torch.allclose(probs.sum(1), torch.ones(3, dtype=torch.float64))
    m = classification_metrics(probs, labels)
    # all three inputs get (p, 1 − p): argmax class 0, two of three right
    assert m["accuracy"] == pytest.approx(2 / 3)
    nll = -(2 * math.log(p) + math.log(1 - p)) / 3
    assert m["nll"] == pytest.approx(nll, abs=3 * tol / (1 - p))
    # one confidence bin holding every input: ECE = |accuracy − confidence|
    assert m["ece"] == pytest.approx(abs(2 / 3 - p), abs=tol)
    brier = (2 * 2 * (1 - p) ** 2 + 2 * p**2) / 3
    assert m["brier"] == pytest.approx(brier, abs=4 * tol)


def test_zero_variance_gives_the_mean_network():
    net, q = bias_only_model()
    q0 = DiagonalGaussian(q.mean, torch.zeros_like(q.variance))
    x = torch.tensor([[0.0], [1.0], [-2.0]], dtype=torch.float64)
    probs = ivon_predictive(net, q0, x, 5)
    with torch.no_grad():
        for p_, v in zip(net.parameters(), (q.mean[:2].view(2, 1), q.mean[2:])):
            p_.copy_(v)
    assert torch.allclose(probs, mean_predictive(net, x), atol=1e-15, rtol=0)


def test_logit_samples_are_seeded_and_restore_the_weights():
    net, q = bias_only_model()
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.zeros(2, 1, dtype=torch.float64)
    a = ivon_logit_samples(net, q, x, 16, seed=5)
    b = ivon_logit_samples(net, q, x, 16, seed=5)
    c = ivon_logit_samples(net, q, x, 16, seed=6)
    assert a.shape == (16, 2, 2) and torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:, :, 1], torch.zeros(16, 2, dtype=torch.float64))  # b1 variance 0
    assert all(torch.equal(p, q_) for p, q_ in zip(net.parameters(), before))
    assert DEFAULT_PREDICTIVE_SAMPLES == 64


def blobs(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
    x = centres[y] + 0.7 * torch.randn(n, 4, generator=g)
    return x.reshape(n, 1, 2, 2), y


def test_train_ivon_learns_with_the_map_prior():
    x, y = blobs()
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    clf = train_ivon(net, x, y, epochs=40, batch_size=32, prior_precision=2.0, seed=0)
    assert clf.settings.ess == 120 and clf.settings.prior_precision == pytest.approx(2.0)
    assert clf.loss[-1] < 0.5 * clf.loss[0]
    assert float((clf.predict(x).argmax(1) == y).double().mean()) > 0.9
    # the model holds the posterior mean; the posterior is a proper diagonal Gaussian
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    assert torch.equal(flat, clf.posterior.mean)
    assert bool((clf.posterior.variance > 0).all())
    # a colder likelihood (T < 1) gives a narrower posterior, all else equal
    net2 = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    cold = train_ivon(net2, x, y, epochs=40, batch_size=32, prior_precision=2.0,
                      temperature=0.1, seed=0)
    assert float(cold.posterior.variance.median()) < 0.5 * float(clf.posterior.variance.median())


def test_train_ivon_is_seeded_and_checks_inputs():
    x, y = blobs(60)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
        runs.append(train_ivon(net, x, y, epochs=3, batch_size=16, seed=1).posterior)
    assert torch.equal(runs[0].mean, runs[1].mean)
    assert torch.equal(runs[0].variance, runs[1].variance)
    with pytest.raises(InputError):
        train_ivon(nn.Linear(4, 3), x, y[:10])


def _tiny_bench_config(**changes):
    from dataclasses import replace

    import ctuq.classify as C
    from ctuq.classify.bench import BenchConfig

    return BenchConfig(hidden=(8,), epochs=4, em_steps=2, em_samples=4, predictive_samples=8,
                       angles=(0.0, 90.0), ivon_samples=8, train_prior_precision=5.0,
                       sto=replace(C.CLASSIFIER_STO, iterations=40)).with_(**changes)


def test_benchmark_ivon_rows_match_a_direct_fit():
    """``run_benchmark(..., ('map', 'ivon', 'ivon+lla', ...))``: finite rows; the ivon row is
    train_ivon + its MC predictive on the same split; adding IVON leaves MAP and LLA as they were."""
    from ctuq.classify.bench import run_benchmark, validation_split
    from ctuq.data.classification import load_classification
    from ctuq.models.classifiers import build_classifier

    data = load_classification("digits", seed=1, n_train=160, n_test=50)
    cfg = _tiny_bench_config()
    res = run_benchmark(data, ("map", "lla-sampled", "ivon", "ivon+lla", "ivon+lla-val"), cfg,
                        seed=1)
    assert list(res.methods) == ["map", "ivon", "lla-sampled", "ivon+lla", "ivon+lla-val"]
    for name, m in res.methods.items():
        assert all(math.isfinite(v) for v in m.metrics.values()), name
        assert m.seconds > 0 and np.isfinite(m.test_probs).all()
        np.testing.assert_allclose(m.test_probs.sum(1), 1.0, atol=1e-6)  # MAP: float32
    ex = res.methods["ivon"].extra
    assert ex["samples"] == 8 and ex["settings"]["prior_precision"] == pytest.approx(5.0)
    tr, _ = validation_split(data.y_train, cfg.val_fraction, 1)
    assert ex["settings"]["ess"] == tr.numel()      # the Bayesian posterior (T = 1)
    # the same network, trained and sampled by hand, gives the same predictive
    net = build_classifier("mlp", data.image_shape, 10, seed=1, hidden=(8,))
    clf = train_ivon(net, data.x_train[tr], data.y_train[tr], epochs=4, batch_size=64,
                     prior_precision=5.0, seed=1)
    probs = clf.predict(data.x_test, 8, seed=1).numpy()
    np.testing.assert_allclose(res.methods["ivon"].test_probs, probs, atol=1e-12)
    assert res.methods["ivon"].metrics["nll"] == pytest.approx(
        float(-np.log(probs[np.arange(len(probs)), data.y_test.numpy()]).mean()))
    # ivon+lla linearises the IVON mean (not the MAP): its own prior fit, the IVON time in it
    lla = res.methods["ivon+lla"]
    assert lla.extra["ivon"]["train_seconds"] <= lla.seconds
    assert lla.extra["variances"] != res.methods["lla-sampled"].extra["variances"]
    assert res.methods["ivon+lla-val"].extra["scale"] >= 0   # tuned on the held-out tenth
    # MAP and its LLA are not touched by the IVON methods (same seeds, same draws)
    alone = run_benchmark(data, ("map", "lla-sampled"), cfg, seed=1)
    for name in ("map", "lla-sampled"):
        np.testing.assert_array_equal(alone.methods[name].test_probs,
                                      res.methods[name].test_probs)


def test_benchmark_ivon_needs_a_prior():
    from ctuq.classify.bench import run_benchmark
    from ctuq.data.classification import load_classification

    data = load_classification("digits", seed=0, n_train=60, n_test=20)
    with pytest.raises(InputError) as err:
        run_benchmark(data, ("map", "ivon"), _tiny_bench_config(train_prior_precision=0.0))
    assert err.value.field == "train_prior_precision"


def test_ivon_settings_follow_the_data_set_unless_given():
    """None in BenchConfig: the data set's validated setting (Fashion-MNIST: T = 0.1, lr 0.03);
    a given value wins; unknown data sets get the digits defaults."""
    from dataclasses import replace

    from ctuq.classify.bench import run_benchmark, validation_split
    from ctuq.classify.ivon import DEFAULTS, settings_for
    from ctuq.data.classification import load_classification

    assert settings_for("digits") == {k: DEFAULTS[k] for k in ("lr", "hess_init", "temperature")}
    assert settings_for("FMNIST") == {"lr": 0.03, "hess_init": 0.03, "temperature": 0.1}
    assert settings_for("fmnist", lr=0.5, temperature=None)["lr"] == 0.5
    data = load_classification("digits", seed=1, n_train=160, n_test=50)
    tr, _ = validation_split(data.y_train, 0.1, 1)
    as_fmnist = replace(data, name="fmnist")      # the digits, under the other name
    ex = run_benchmark(as_fmnist, ("ivon",), _tiny_bench_config(), seed=1).methods["ivon"].extra
    assert ex["settings"]["ess"] == pytest.approx(tr.numel() / 0.1)
    assert ex["settings"]["lr"] == pytest.approx(0.03)
    ex = run_benchmark(as_fmnist, ("ivon",), _tiny_bench_config(ivon_temperature=1.0, ivon_lr=1.0),
                       seed=1).methods["ivon"].extra
    assert ex["settings"]["ess"] == tr.numel() and ex["settings"]["lr"] == pytest.approx(1.0)
