"""Classification-benchmark mode: data, classifiers, linearised Laplace with STO samples and
MacKay/EM, exact dense oracle, metrics, the benchmark runner and the CLI command."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
import math
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch

from ctuq.data.classification import (load_classification, load_mnist_like, permuted_images,
                                      read_idx, rotate_images)
from ctuq.errors import InputError
import ctuq.classify as C
from ctuq.models.classifiers import build_classifier
from ctuq.posterior import b_mul_jacobian
from ctuq.classify import metrics as M


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny products: one thread (conftest)


# ------------------------------------------------------------------------------ fixtures


def _toy_data(n=120, seed=0, classes=3):
    """Three noisy 4×4 class templates: a tiny, not linearly trivial problem."""
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(classes, 1, 4, 4, generator=g)
    y = torch.arange(n) % classes
    x = means[y] + 0.35 * torch.randn(n, 1, 4, 4, generator=g)
    return x, y


@pytest.fixture(scope="module")
def tiny(one_thread):
    """A trained tiny MLP (123 parameters), its linearisation and the exact dense LLA."""
    x, y = _toy_data()
    net = build_classifier("mlp", (1, 4, 4), 3, hidden=(6,), seed=0)
    C.train_map(net, x, y, epochs=60, lr=1e-2, batch_size=32, prior_precision=1.0)
    clin = C.ClassifierLinearization(net, x)
    exact = C.ExactLLA(clin, x, y)
    return x, y, net, clin, exact


# ------------------------------------------------------------------------------ metrics


P3 = np.array([[0.7, 0.3], [0.4, 0.6], [0.5, 0.5]])
Y3 = np.array([0, 0, 1])


def test_metrics_hand_computed():
    # argmax: 0, 1, 0 (a tie goes to the first class) -> only the first is right
    assert M.accuracy(P3, Y3) == pytest.approx(1 / 3)
    assert M.nll(P3, Y3) == pytest.approx(-(math.log(0.7) + math.log(0.4) + math.log(0.5)) / 3)
    # Brier: (0.09 + 0.09) + (0.36 + 0.36) + (0.25 + 0.25), mean over 3
    assert M.brier(P3, Y3) == pytest.approx(1.4 / 3)
    # ECE, 2 bins (0, .5], (.5, 1]: bin 0 = {0.5: wrong} gap .5; bin 1 = {0.7 right, 0.6 wrong}
    # accuracy .5, confidence .65, gap .15 -> 1/3 * .5 + 2/3 * .15
    assert M.ece(P3, Y3, n_bins=2) == pytest.approx(1 / 6 + 0.1)
    rel = M.reliability(P3, Y3, n_bins=2)
    assert rel["count"] == [1, 2] and rel["accuracy"] == pytest.approx([0.0, 0.5])
    assert rel["confidence"] == pytest.approx([0.5, 0.65])
    # 15 bins: three singleton bins, gaps .5 (0.5 wrong), .3 (0.7 right), .6 (0.6 wrong)
    assert M.ece(P3, Y3) == pytest.approx((0.5 + 0.3 + 0.6) / 3)
    assert M.classification_metrics(P3, Y3)["brier"] == pytest.approx(1.4 / 3)


def test_ood_auroc_and_entropy_hand_computed():
    p_in = np.array([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4]])
    p_out = np.array([[0.3, 0.7], [0.5, 0.5]])
    # in-distribution confidences .9 .8 .6 vs OOD .7 .5: 5 of the 6 pairs ordered right
    assert M.ood_auroc(p_in, p_out) == pytest.approx(5 / 6)
    assert M.ood_auroc(p_in, p_in[:1] * 0 + [[0.5, 0.5]]) == pytest.approx(1.0)
    ent = M.predictive_entropy(np.array([[0.25] * 4, [1.0, 0, 0, 0]]))
    assert ent == pytest.approx([math.log(4), 0.0], abs=1e-9)


def test_metrics_reject_bad_input():
    with pytest.raises(InputError, match="sum to 1"):
        M.nll(np.array([[0.5, 0.6]]), [0])
    with pytest.raises(InputError) as err:
        M.accuracy(P3, [0, 1, 2])
    assert err.value.field == "labels"
    with pytest.raises(InputError):
        M.ece(P3, Y3, n_bins=0)
    with pytest.raises(InputError):
        M.ood_auroc(P3, np.zeros((0, 2)))


# ------------------------------------------------------------------------------ data


def _write_idx(path, arr, compress=False):
    codes = {np.uint8: 0x08, np.int32: 0x0C}
    head = bytes([0, 0, codes[arr.dtype.type], arr.ndim]) + struct.pack(f">{arr.ndim}I",
                                                                        *arr.shape)
    body = head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    (gzip.open if compress else open)(path, "wb").write(body)


def test_read_idx_plain_gzip_and_errors(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "a", a)
    _write_idx(tmp_path / "b.gz", a, compress=True)
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), a)
    np.testing.assert_array_equal(read_idx(tmp_path / "b.gz"), a)
    i32 = np.array([1, -2, 70000], dtype=np.int32)
    _write_idx(tmp_path / "c", i32)
    np.testing.assert_array_equal(read_idx(tmp_path / "c"), i32)
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(InputError) as err:
        read_idx(tmp_path / "bad")
    assert err.value.field == "magic" and err.value.file.endswith("bad")
    (tmp_path / "short").write_bytes((tmp_path / "a").read_bytes()[:-5])
    with pytest.raises(InputError, match="truncated"):
        read_idx(tmp_path / "short")


def test_mnist_like_from_idx_and_npz_and_missing(tmp_path):
    rng = np.random.default_rng(0)
    x_tr = rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)
    y_tr = (np.arange(20) % 10).astype(np.uint8)
    x_te, y_te = x_tr[:10], y_tr[:10]
    sub = tmp_path / "Fashion-MNIST"
    sub.mkdir()
    for name, arr in (("train-images-idx3-ubyte", x_tr), ("train-labels-idx1-ubyte", y_tr),
                      ("t10k-images-idx3-ubyte", x_te), ("t10k-labels-idx1-ubyte", y_te)):
        _write_idx(sub / (name + ".gz"), arr, compress=True)
    raw = load_mnist_like("fmnist", tmp_path)       # found in the sub-folder
    np.testing.assert_array_equal(raw["x_train"], x_tr)
    np.savez(tmp_path / "mnist.npz", x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te)
    data = load_classification("mnist", tmp_path, seed=1, ood_dir=tmp_path, n_train=12)
    assert data.x_train.shape == (12, 1, 28, 28) and data.ood_name == "Fashion-MNIST"
    assert float(data.x_train.max()) <= 1.0 and data.x_ood.shape == (10, 1, 28, 28)
    with pytest.raises(InputError) as err:
        load_classification("kmnist", tmp_path)
    assert err.value.field == "kmnist" and err.value.file == str(tmp_path)
    assert "t10k-images-idx3-ubyte" in str(err.value)
    with pytest.raises(InputError) as err:
        load_classification("mnist")                 # no folder given: never downloads
    assert err.value.field == "data_dir"
    np.savez(tmp_path / "kmnist.npz", x_train=x_tr)
    with pytest.raises(InputError, match="missing arrays"):
        load_classification("kmnist", tmp_path)


def test_fmnist_default_folder_is_debians(tmp_path, monkeypatch):
    """Without data_dir, Fashion-MNIST is read from SYSTEM_DATA_DIR/fashion-mnist (Debian's
    dataset-fashion-mnist layout); with nothing there the error says how to install it."""
    import ctuq.data.classification as dc

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (12, 28, 28), dtype=np.uint8)
    y = (np.arange(12) % 10).astype(np.uint8)
    sub = tmp_path / "fashion-mnist"
    sub.mkdir()
    for name, arr in (("train-images-idx3-ubyte", x), ("train-labels-idx1-ubyte", y),
                      ("t10k-images-idx3-ubyte", x[:10]), ("t10k-labels-idx1-ubyte", y[:10])):
        _write_idx(sub / (name + ".gz"), arr, compress=True)
    monkeypatch.setattr(dc, "SYSTEM_DATA_DIR", tmp_path)
    data = load_classification("fmnist", seed=0)
    assert data.x_train.shape == (12, 1, 28, 28)
    assert all(f.startswith(str(sub)) for f in data.info["files"])
    monkeypatch.setattr(dc, "SYSTEM_DATA_DIR", tmp_path / "empty")
    with pytest.raises(InputError) as err:
        load_classification("fmnist")
    assert err.value.field == "data_dir" and "apt-get install dataset-fashion-mnist" in str(
        err.value)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian's dataset-fashion-mnist is not installed (make install as "
                           "root installs it)")
def test_fmnist_from_the_debian_package():
    data = load_classification("fmnist", seed=0, n_train=50, n_test=20)
    assert data.x_train.shape == (50, 1, 28, 28) and data.num_classes == 10
    assert data.info["files"][0].startswith("/usr/share/datasets/fashion-mnist/")


def test_digits_split_ood_and_rotation():
    d = load_classification("digits", seed=3)
    assert d.x_train.shape[0] + d.x_test.shape[0] == 1797 and d.num_classes == 10
    assert float(d.x_train.min()) >= 0 and float(d.x_train.max()) <= 1
    # stratified: every class has ~30 % of its images in the test set
    counts = torch.bincount(d.y_test, minlength=10).float() / torch.bincount(
        torch.cat([d.y_train, d.y_test]), minlength=10).float()
    assert bool(((counts - 0.3).abs() < 0.02).all())
    # permuted OOD images keep each image's pixel values, not their arrangement
    np.testing.assert_allclose(d.x_ood.flatten(1).sort(1).values,
                               d.x_test.flatten(1).sort(1).values)
    assert not torch.equal(d.x_ood, d.x_test)
    h = load_classification("digits", seed=3, ood="holdout", holdout_classes=(8, 9))
    assert h.num_classes == 8 and int(h.y_train.max()) == 7 and h.x_ood.shape[0] > 0
    with pytest.raises(InputError):
        load_classification("digits", ood="holdout", holdout_classes=(12,))
    # rotations: 180° flips both axes exactly, 90° is np.rot90 (counter-clockwise as shown)
    x = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(rotate_images(x, 180), x.flip(-1).flip(-2), atol=1e-5, rtol=0)
    torch.testing.assert_close(rotate_images(x, 90), torch.rot90(x, 1, (-2, -1)), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(d.rotated(0), d.x_test)
    p = permuted_images(x, 0)
    torch.testing.assert_close(p, permuted_images(x, 0))


# ------------------------------------------------------------------------------ models


def test_classifiers_shapes_blocks_and_errors():
    cnn = build_classifier("cnn", (1, 8, 8), 10, seed=0)
    assert cnn(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert sum(p.numel() for p in cnn.parameters()) == 1898
    clin = C.ClassifierLinearization(cnn, torch.zeros(2, 1, 8, 8))
    assert list(clin.blocks) == ["conv_0", "conv_1", "out"]
    assert clin.num_params == 1898                          # weights and biases
    a = build_classifier("mlp", (1, 8, 8), 10, seed=5)
    b = build_classifier("mlp", (1, 8, 8), 10, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(InputError):
        build_classifier("cnn", (1, 6, 6), 10)               # 6 is not divisible by 4
    with pytest.raises(InputError):
        build_classifier("resnet", (1, 8, 8), 10)
    with pytest.raises(InputError):
        build_classifier("mlp", (1, 8, 8), 10, dropout=1.0)


# ------------------------------------------------------------------------------ engine


def test_lambda_factor_and_products_match_dense(tiny):
    x, y, net, clin, exact = tiny
    p = torch.softmax(torch.randn(5, 4, dtype=torch.float64), -1)
    eye = torch.eye(4, dtype=torch.float64)
    B = C.b_mul(p.unsqueeze(1), eye.unsqueeze(0))           # rows B_n e_c -> B_n[:, c]
    Bm = B.transpose(1, 2)                                  # [n, C, C] = B_n
    Lam = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
    torch.testing.assert_close(Bm.transpose(1, 2) @ Bm, Lam)
    r = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(C.lambda_mul(p, r), (Lam @ r.unsqueeze(2)).squeeze(2))
    torch.testing.assert_close(C.bt_mul(p, r), (Bm.transpose(1, 2) @ r.unsqueeze(2)).squeeze(2))
    # JVP / VJP against the dense Jacobian, and G against an explicit sum of J_nᵀ Λ_n J_n
    J = clin.jacobian(x[:7], torch.float64)                 # [7, 3, d]
    v = torch.randn(2, clin.num_params)
    torch.testing.assert_close(clin.jvp_at(v, x[:7]).double(),
                               torch.einsum("ncd,kd->knc", J, v.double()), atol=1e-4, rtol=1e-4)
    u = torch.randn(2, 7, 3)
    torch.testing.assert_close(clin.vjp_at(u, x[:7]).double(),
                               torch.einsum("ncd,knc->kd", J, u.double()), atol=1e-4, rtol=1e-4)
    Jall = clin.jacobian(x, torch.float64)
    pa = torch.softmax(clin.logits(x).double(), -1)
    La = torch.diag_embed(pa) - pa.unsqueeze(2) * pa.unsqueeze(1)
    G = torch.einsum("ncd,nce,nef->df", Jall, La, Jall)
    torch.testing.assert_close(exact.G, G, atol=1e-4 * float(G.abs().max()), rtol=1e-4)


def test_gprior_scales_exact_and_by_probes(tiny):
    x, y, net, clin, exact = tiny
    gp = C.gprior_for(clin, x, exact=True)
    # s_i = (diag(G)_i / N)^(-1/2) with G the exact dense GGN
    torch.testing.assert_close(gp.scale, (exact.G.diagonal() / len(y)).rsqrt(), rtol=1e-4,
                               atol=0)
    gq = C.gprior_for(clin, x, exact=False, n_probes=512,
                      generator=torch.Generator().manual_seed(0))
    rel = (gq.scale / gp.scale) ** -2 - 1              # error of the diag(G) estimate
    assert float(rel.abs().mean()) < 0.1               # sqrt(2/512) = 6 % per entry at most


def test_sto_matches_the_exact_solution_of_its_draws(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=0.5)
    s = C.sample_sto(clin, x, prior, 6, generator=torch.Generator().manual_seed(3))
    assert s.info["converged"] and s.z.shape == (6, clin.num_params)
    w_exact = exact.solve_whitened(prior, s.state.anchor)
    with torch.no_grad():
        z_exact = prior.cov_sqrt(w_exact)
    err = (s.z.double() - z_exact).norm(dim=1) / z_exact.norm(dim=1)
    assert float(err.max()) < 1e-2
    # and that is the Matheron sample of its draws (u, e), the CT samplers' convention:
    # θ⁰ − ΣΦᵀ(ΦΣΦᵀ + I)⁻¹(Φθ⁰ + e) = H⁻¹(Σ⁻¹θ⁰ − Φᵀe) with Φ = B J
    Phi = b_mul_jacobian(clin.probs(x).double(), clin.jacobian(x, torch.float64))
    Phi = Phi.reshape(-1, clin.num_params)
    with torch.no_grad():
        theta0 = prior.cov_sqrt(s.state.base_u.double())
        rhs = prior.precision(theta0) - s.state.base_e.double() @ Phi
    z_matheron = torch.linalg.solve(exact.hessian(prior), rhs.t()).t()
    assert float(((z_matheron - z_exact).norm(dim=1) / z_exact.norm(dim=1)).max()) < 1e-5
    # without a preconditioner (plain Nesterov SGD) and mini-batched, same draws: close too
    opts = replace(C.CLASSIFIER_STO, iterations=1500, precond_rank=0, batch_size=60,
                   polyak_start=0.5)
    s2 = C.sample_sto(clin, x, prior, 6, options=opts, generator=torch.Generator().manual_seed(3))
    err2 = (s2.z.double() - z_exact).norm(dim=1) / z_exact.norm(dim=1)
    assert float(err2.max()) < 0.1
    with pytest.raises(InputError):
        C.sample_sto(clin, x, prior, 0)
    with pytest.raises(InputError):
        C.sample_sto(clin, x, prior, 2, options=replace(C.CLASSIFIER_STO, batch_size=10_000))
    for bad in ({"batch_size": 0}, {"batch_size": True}, {"iterations": 0}):
        with pytest.raises(InputError, match=next(iter(bad))):
            C.STOOptions(**bad)


@pytest.mark.parametrize("variance", [0.5, 5.0])
def test_minibatched_sto_sizes_its_steps_for_a_batch(tiny, variance):
    # with the Nyström preconditioner the full whitened Hessian is ≈ I, but one batch of
    # 4 of 120 points, scaled by 30, is not: steps sized for the full curvature (the rule
    # before curvature_batches) leave errors of 0.12 and 0.37 here
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=variance)
    opts = replace(C.CLASSIFIER_STO, iterations=1500, batch_size=4, polyak_start=0.5)
    s = C.sample_sto(clin, x, prior, 6, options=opts, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        z_exact = prior.cov_sqrt(exact.solve_whitened(prior, s.state.anchor))
    err = (s.z.double() - z_exact).norm(dim=1) / z_exact.norm(dim=1)
    assert float(err.max()) < 0.1
    assert s.info["curvature_max"] > 5.0    # the batches' curvature, not the full ≈ 1.1


def test_sampled_predictive_agrees_with_exact_within_mc_error(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=1.0)
    k = 400
    s = C.sample_sto(clin, x, prior, k, generator=torch.Generator().manual_seed(11))
    xt, _ = _toy_data(30, seed=5)
    fs = C.function_samples(clin, s.z, xt)                  # [k, 30, 3]
    probs_s = torch.softmax(fs.double(), -1)
    p_sampled = probs_s.mean(0)
    se = probs_s.std(0) / math.sqrt(k)
    f, cov = exact.function_covariance(prior, xt)
    p_exact = C.gaussian_mc_predictive(f, cov, 40_000, torch.Generator().manual_seed(0))
    # the exact reference has its own (200x smaller-variance) MC error: 4.5 sigma overall
    assert bool(((p_sampled - p_exact).abs() <= 4.5 * se * math.sqrt(1 + k / 40_000)
                 + 1e-4).all())
    # the mean difference is small relative to the spread (not just within a loose band)
    assert float((p_sampled - p_exact).abs().mean()) < 0.02
    # function-space variances: chi-square error ≈ sqrt(2 / k) = 7 % per entry
    var_s = C.sample_function_variance(fs - clin.logits(xt))
    rel = (var_s / cov.diagonal(dim1=-2, dim2=-1) - 1).abs()
    assert float(rel.mean()) < 0.1 and float(rel.max()) < 0.4
    # the probit predictive from sample variances is close to the exact probit one
    pr_s = C.probit_predictive(clin.logits(xt), var_s)
    pr_e = C.probit_predictive(f, cov.diagonal(dim1=-2, dim2=-1))
    assert float((pr_s - pr_e).abs().max()) < 0.03


@pytest.mark.parametrize("kind", ["ard", "gprior"])
def test_em_prior_agrees_with_exact_evidence_optimum(tiny, kind):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, kind, variance=1.0)
    em = C.fit_prior(clin, x, prior, em_steps=20, k=32,
                     generator=torch.Generator().manual_seed(2))
    ref = C.build_prior(clin, x, kind, variance=1.0)
    opt = exact.optimize_prior(ref)
    assert opt["grad_norm"] < 1e-3
    a_em = torch.tensor(em.hyperparameters()["a_b"])
    a_ex = torch.tensor(opt["variances"])
    assert bool(((a_em / a_ex - 1).abs() < 0.15).all()), (a_em, a_ex)
    # the exact optimum is a maximum: moving every variance by ±20 % lowers the evidence
    base = exact.log_evidence(a_ex.double().log(), ref)
    for f in (0.8, 1.2):
        assert float(exact.log_evidence((a_ex.double() * f).log(), ref)) < float(base)
    # and the sampled gamma estimate at the end matches the exact gamma there
    g_ex = exact.gamma(prior)
    g_em = torch.tensor(em.trace[-1]["gamma_hat"], dtype=torch.float64)
    assert bool(((g_em / g_ex - 1).abs() < 0.15).all())


def test_exact_evidence_matches_brute_force(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=[0.3, 2.0])
    a = prior.variances.detach().double()
    var = torch.cat([torch.full((sl.stop - sl.start,), float(a[b]), dtype=torch.float64)
                     for b, sl in enumerate(prior.block_slices.values())])
    H = exact.G + torch.diag(1 / var)
    th = clin.theta_hat.double()
    ll = float(torch.log_softmax(clin.logits(x).double(), -1)[torch.arange(len(y)), y].sum())
    brute = ll - 0.5 * float((th ** 2 / var).sum()) - 0.5 * float(var.log().sum()) \
        - 0.5 * float(torch.linalg.slogdet(H)[1])
    assert float(exact.log_evidence(a.log(), prior)) == pytest.approx(brute, rel=1e-4)
    torch.testing.assert_close(exact.covariance(prior), torch.linalg.inv(H), rtol=1e-6,
                               atol=1e-9)
    # γ_b = d_b − Tr(Σ_b⁻¹ H⁻¹_bb)
    Hi = torch.linalg.inv(H)
    g0 = prior.block_dims[0] - float((Hi.diagonal()[:102] / var[:102]).sum())
    assert float(exact.gamma(prior)[0]) == pytest.approx(float(g0), rel=1e-6)


def test_prior_scale_family_is_the_dense_posterior_for_every_multiplier(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=[0.3, 2.0])
    W, lam = exact.prior_scale_basis(prior)
    xv, yv = _toy_data(40, seed=5)
    f, K = exact.prior_scale_factor(W, xv)
    J = clin.jacobian(xv, torch.float64).reshape(-1, clin.num_params)
    torch.testing.assert_close(f, clin.logits(xv).double(), rtol=1e-5, atol=1e-5)
    for c in (0.05, 1.0, 30.0):
        # (G + c Σ⁻¹)⁻¹ from the one eigendecomposition against a dense inverse
        Hc = exact.G + c * (exact.hessian(prior) - exact.G)       # G + c Σ⁻¹
        cov = (J @ torch.linalg.solve(Hc, J.t())).reshape(40, 3, 40, 3)
        cov = torch.stack([cov[n, :, n, :] for n in range(40)])
        torch.testing.assert_close(C.scaled_prior_covariance(K, lam, c), cov, rtol=1e-7,
                                   atol=1e-10)
    # c = 1 is the exact LLA's own function-space covariance
    torch.testing.assert_close(C.scaled_prior_covariance(K, lam, 1.0),
                               exact.function_covariance(prior, xv)[1], rtol=1e-7, atol=1e-10)


def test_tuned_prior_scale_maximises_validation_likelihood(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=1.0)
    W, lam = exact.prior_scale_basis(prior)
    xv, _ = _toy_data(60, seed=7)
    f, K = exact.prior_scale_factor(W, xv)
    for labels, where in ((f.argmax(-1), "high"),                          # MAP is right
                          ((f.argmax(-1) + 1) % 3, "low")):                 # MAP is wrong
        tune = C.tune_prior_scale(f, K, lam, labels, n_samples=200,
                                  generator=torch.Generator().manual_seed(0))
        assert tune["nll"] <= min(tune["grid_nll"]) + 1e-12
        assert tune["nll"] <= tune["nll_at_1"] + 1e-12
        # labels the MAP gets right favour little spread (large c), wrong ones a wide one
        assert (tune["scale"] > 1.0) if where == "high" else (tune["scale"] < 1.0)
    # the grid's largest c winning is reported (the validation set prefers MAP)
    assert C.tune_prior_scale(f, K, lam, f.argmax(-1), n_samples=50, grid=[0.1, 1.0, 10.0],
                              generator=torch.Generator().manual_seed(0))["at_boundary"]
    with pytest.raises(InputError):
        C.tune_prior_scale(f, K, lam, f.argmax(-1), grid=[0.0, 1.0])


def test_linear_mode_is_stationary_and_em_linear_mode_runs(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=0.5)
    theta = C.linear_mode(clin, x, y, prior)
    J = clin.jacobian(x, torch.float64).reshape(-1, clin.num_params)
    h = clin.logits(x).double() + (J @ (theta - clin.theta_hat).double()).reshape(len(y), 3)
    resid = torch.softmax(h, -1) - torch.nn.functional.one_hot(y, 3).double()
    with torch.no_grad():
        reg = prior.precision(theta.double().reshape(1, -1))[0]
    grad = J.t() @ resid.reshape(-1) + reg
    # the linear model's optimum (float32 products; at θ̂ the same ratio is 0.53)
    assert float(grad.norm()) < 5e-3 * float(reg.norm())
    torch.testing.assert_close(C.linear_logits(clin, theta, x).double(), h, atol=1e-4,
                               rtol=1e-4)
    em = C.fit_prior(clin, x, prior, em_steps=2, k=4, mode="linear", y=y)
    assert em.theta_star is not None and em.likelihood.probs.shape == (len(y), 3)
    with pytest.raises(InputError):
        C.fit_prior(clin, x, prior, mode="linear")              # needs the labels
    with pytest.raises(InputError):
        C.fit_prior(clin, x, prior, mode="nn")


def test_train_map_dropout_and_errors(tiny):
    x, y, net, clin, exact = tiny
    loss_net = build_classifier("mlp", (1, 4, 4), 3, hidden=(6,), seed=1)
    hist = C.train_map(loss_net, x, y, epochs=60, lr=1e-2)["loss"]
    assert hist[-1] < 0.75 * hist[0]
    with pytest.raises(InputError):
        C.mc_dropout_predict(net, x)                        # no dropout layer
    dnet = build_classifier("mlp", (1, 4, 4), 3, hidden=(6,), dropout=0.3, seed=0)
    C.train_map(dnet, x, y, epochs=5)
    p1 = C.mc_dropout_predict(dnet, x[:5], 20, seed=0)
    torch.testing.assert_close(p1, C.mc_dropout_predict(dnet, x[:5], 20, seed=0))
    assert not dnet.training and torch.allclose(p1.sum(-1), torch.ones(5, dtype=p1.dtype))
    with pytest.raises(InputError):
        C.fit_prior(clin, x, C.build_prior(clin, x), update="newton")
    with pytest.raises(InputError):
        C.build_prior(clin, x, "matern")
    assert C.laplace_torch_available() in (True, False)


def test_tuned_scale_maximises_validation_likelihood_and_t1_is_the_plain_lla(tiny):
    x, y, net, clin, exact = tiny
    prior = C.build_prior(clin, x, "ard", variance=1.0)
    s = C.sample_sto(clin, x, prior, 32, generator=torch.Generator().manual_seed(3))
    xv, yv = _toy_data(60, seed=7)
    fs = C.function_samples(clin, s.z, xv)
    f = clin.logits(xv)
    dev = fs.double() - f.double()          # exact in float64
    # t = 1 is the plain sampled LLA predictive, t = 0 the MAP softmax, exactly
    torch.testing.assert_close(C.scaled_mc_predictive(f, dev, 1.0), C.mc_predictive(fs),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(C.scaled_mc_predictive(f, dev, 0.0),
                               torch.softmax(f.double(), -1), rtol=0, atol=1e-12)
    # the log-sum-exp NLL is the metric's NLL of the scaled predictive
    for t in (0.0, 0.4, 2.0):
        assert C.scaled_predictive_nll(f, dev, yv, t) == pytest.approx(
            M.nll(C.scaled_mc_predictive(f, dev, t), yv), rel=1e-9)
    tune = C.tune_predictive_scale(f, dev, yv)
    assert tune["nll_at_1"] == pytest.approx(C.scaled_predictive_nll(f, dev, yv, 1.0))
    brute = np.linspace(0, 10, 4001)
    b = [C.scaled_predictive_nll(f, dev, yv, t) for t in brute]
    assert tune["nll"] <= min(b) + 1e-9
    assert tune["nll"] == pytest.approx(C.scaled_predictive_nll(f, dev, yv, tune["scale"]))

    # an overconfident predictive (wrong labels at logit margin 6): the optimum is interior
    g = torch.Generator().manual_seed(0)
    n = 300
    yy = torch.randint(0, 3, (n,), generator=g)
    pred = torch.where(torch.rand(n, generator=g) < 0.7, yy, torch.randint(0, 3, (n,),
                                                                          generator=g))
    fm = 6.0 * torch.nn.functional.one_hot(pred, 3).double()
    d = torch.randn(64, n, 3, generator=g, dtype=torch.float64)
    tune = C.tune_predictive_scale(fm, d, yy)
    brute = np.linspace(0, 10, 4001)
    b = np.array([C.scaled_predictive_nll(fm, d, yy, t) for t in brute])
    assert 0.5 < tune["scale"] < 9.5 and not tune["at_boundary"]
    assert tune["nll"] <= b.min() + 1e-9
    assert abs(tune["scale"] - brute[b.argmin()]) < 0.01
    # a grid ending below the optimum says so
    assert C.tune_predictive_scale(fm, d, yy, grid=[0.0, 0.1, 0.2])["at_boundary"]
    with pytest.raises(InputError):
        C.tune_predictive_scale(fm, d, yy, grid=[-1.0, 1.0])


def test_temperature_scaling_matches_brute_force():
    g = torch.Generator().manual_seed(1)
    y = torch.randint(0, 4, (200,), generator=g)
    f = 5 * torch.nn.functional.one_hot(y, 4).double() + 2.5 * torch.randn(200, 4, generator=g,
                                                                        dtype=torch.float64)
    res = C.tune_temperature(f, y)
    Ts = np.geomspace(0.05, 20, 20001)
    b = [float(torch.nn.functional.cross_entropy(f / T, y)) for T in Ts]
    assert res["temperature"] == pytest.approx(Ts[int(np.argmin(b))], rel=2e-3)
    assert res["val_nll"] <= min(b) + 1e-9 and res["val_nll"] < res["val_nll_at_1"]


def test_last_layer_linearisation_and_gaussian_deviations(tiny):
    x, y, net, clin, exact = tiny
    ll = C.ClassifierLinearization(net, x, param_filter=C.last_layer_filter(net))
    assert list(ll.blocks) == ["out"] and ll.num_params == 6 * 3 + 3
    assert ll.param_names == ["out.weight", "out.bias"]
    torch.testing.assert_close(ll.logits(x), clin.logits(x))
    # its Jacobian is the full Jacobian's output-layer columns
    sl = clin.block_slices["out"]
    torch.testing.assert_close(ll.jacobian(x[:10]), clin.jacobian(x[:10])[..., sl])
    # the engine runs on it unchanged: EM agrees with the exact evidence of the subset
    prior = C.build_prior(ll, x, "ard")
    em = C.fit_prior(ll, x, prior, em_steps=20, k=32, generator=torch.Generator().manual_seed(2))
    ref = C.build_prior(ll, x, "ard")
    opt = C.ExactLLA(ll, x, y).optimize_prior(ref)
    assert abs(em.hyperparameters()["a_b"][0] / opt["variances"][0] - 1) < 0.15
    # Gaussian deviations have the requested covariance
    f, cov = exact.function_covariance(C.build_prior(clin, x, "ard"), x[:4])
    d = C.gaussian_deviations(cov, 20_000, torch.Generator().manual_seed(0))
    emp = torch.einsum("snc,snd->ncd", d, d) / d.shape[0]
    assert float((emp - cov).abs().max()) < 0.05 * float(cov.diagonal(dim1=-2, dim2=-1).max())


def test_validation_split_is_stratified_seeded_and_disjoint():
    from ctuq.classify.bench import validation_split

    y = torch.arange(103) % 5
    tr, va = validation_split(y, 0.2, seed=3)
    assert sorted(tr.tolist() + va.tolist()) == list(range(103))
    assert set(tr.tolist()).isdisjoint(va.tolist())
    assert [int((y[va] == c).sum()) for c in range(5)] == [4, 4, 4, 4, 4]
    tr2, va2 = validation_split(y, 0.2, seed=3)
    assert torch.equal(va, va2) and not torch.equal(va, validation_split(y, 0.2, seed=4)[1])
    assert validation_split(y, 0.0)[1].numel() == 0
    with pytest.raises(InputError):
        validation_split(y, 1.0)


# ------------------------------------------------------------------------------ benchmark


def _tiny_config():
    from ctuq.classify.bench import BenchConfig

    return BenchConfig(hidden=(8,), epochs=3, em_steps=2, em_samples=4, predictive_samples=8,
                       mc_dropout_samples=4, exact_mc_samples=50, angles=(0.0, 90.0),
                       sto=replace(C.CLASSIFIER_STO, iterations=50))


def test_run_benchmark_smoke():
    from ctuq.data.classification import load_classification
    from ctuq.classify.bench import LAPLACE_TORCH_METHODS, METHODS, aggregate, run_benchmark

    data = load_classification("digits", seed=0, n_train=200, n_test=60)
    res = run_benchmark(data, "all", _tiny_config(), seed=0)
    expect = set(METHODS) - (set() if C.laplace_torch_available() else set(LAPLACE_TORCH_METHODS))
    assert set(res.methods) == expect
    doc = json.loads(json.dumps(res.to_dict()))
    for name, m in doc["methods"].items():
        assert 0 <= m["metrics"]["accuracy"] <= 1 and m["metrics"]["nll"] > 0
        assert [r["angle"] for r in m["rotation"]] == [0.0, 90.0]
        assert sum(m["reliability"]["count"]) == 60 and m["reliability"]["n_bins"] == 15
    # MAP and the LLA share the network: identical rotation-0 accuracy source, probabilities differ
    assert res.methods["map"].test_probs.shape == (60, 10)
    agg = aggregate([res, res])
    assert agg["map"]["nll"]["std"] == 0.0 and len(agg["map"]["nll"]["values"]) == 2
    # the validation split comes out of the training set, for every method
    assert res.dataset["n_train"] + res.dataset["n_val"] == 200 and res.dataset["n_val"] == 20
    for name in ("lla-sampled-val", "lla-last-layer-val", "lla-exact-val"):
        ex = res.methods[name].extra
        assert ex["scale"] >= 0 and ex["val_nll"] <= ex["val_nll_at_1"] + 1e-12
    ex = res.methods["lla-exact-prior-val"].extra
    assert ex["prior_scale"] > 0 and ex["val_nll"] <= ex["val_nll_at_1"] + 1e-12
    assert res.methods["lla-last-layer"].extra["num_params"] == 8 * 10 + 10
    assert res.methods["map-temp"].extra["temperature"] > 0
    with pytest.raises(InputError):
        run_benchmark(data, "map,bogus", _tiny_config())
    with pytest.raises(InputError):
        run_benchmark(data, "map,lla-sampled-val", _tiny_config().with_(val_fraction=0.0))
    with pytest.raises(InputError, match="at most the 180 training images"):
        run_benchmark(data, "map,lla-sampled", _tiny_config().with_(
            sto=replace(C.CLASSIFIER_STO, batch_size=181)))


def test_laplace_torch_methods_are_skipped_with_a_reason(monkeypatch):
    from ctuq.classify.bench import run_benchmark

    data = load_classification("digits", seed=0, n_train=120, n_test=30)
    cfg = _tiny_config().with_(epochs=1)
    from ctuq.classify import baselines

    for module in (C, baselines):  # the benchmark asks the package, the fit its module
        monkeypatch.setattr(module, "laplace_torch_available", lambda: False)
    res = run_benchmark(data, "map,laplace-torch,laplace-torch-ll", cfg)
    assert set(res.methods) == {"map"}
    assert all("does not import" in res.skipped[m] for m in ("laplace-torch",
                                                             "laplace-torch-ll"))
    with pytest.raises(InputError, match="laplace-torch is not installed"):
        C.laplace_torch_fit(build_classifier("mlp", (1, 8, 8), 10, hidden=(3,)),
                            data.x_train, data.y_train)
    # importable but too large for a full GGN: only the full-GGN method is refused
    monkeypatch.setattr(C, "laplace_torch_available", lambda: True)
    monkeypatch.setattr(C, "laplace_torch_fit",
                        lambda net, x, y, **kw: (lambda xe: torch.full((len(xe), 10), 0.1,
                                                                       dtype=torch.float64),
                                                 dict(kw)))
    res = run_benchmark(data, "map,laplace-torch,laplace-torch-ll",
                        cfg.with_(max_exact_params=10))
    assert set(res.methods) == {"map", "laplace-torch-ll"}
    assert "max_exact_params 10" in res.skipped["laplace-torch"]
    assert res.methods["laplace-torch-ll"].extra == {"subset": "last_layer", "structure": "kron"}


def test_cli_bench_classify(tmp_path, monkeypatch):
    from ctuq.app import cli
    from ctuq.classify import bench as classify_bench

    base = _tiny_config()
    monkeypatch.setattr(classify_bench, "BenchConfig",
                        lambda **kw: base.with_(**{k: v for k, v in kw.items()
                                                   if k not in ("epochs",)}))
    rc = cli.main(["bench-classify", "--dataset", "digits", "--methods", "map,lla-sampled",
                   "--out", str(tmp_path), "--seeds", "0", "--n-train", "150",
                   "--n-test", "40", "--train-prior-precision", "10",
                   "--sto-batch-size", "45"])
    assert rc == 0
    doc = json.loads((tmp_path / "bench_classify.json").read_text())
    assert set(doc["aggregate"]) == {"map", "lla-sampled"}
    run = doc["runs"][0]
    assert run["config"]["train_prior_precision"] == 10.0
    assert run["config"]["sto"]["batch_size"] == 45
    # mini-batched STO runs all its steps (no full-batch early stop)
    assert run["methods"]["lla-sampled"]["extra"]["sto_iterations"] == 300
    for bad in (["--train-prior-precision", "-1"], ["--sto-batch-size", "0"]):
        assert cli.main(["bench-classify", *bad, "--out", str(tmp_path)]) == 2
    assert (tmp_path / "reliability.png").stat().st_size > 1000
    assert (tmp_path / "rotation.png").stat().st_size > 1000
    # a missing data set is one clear error line and exit code 2
    assert cli.main(["bench-classify", "--dataset", "mnist", "--out", str(tmp_path)]) == 2
    assert cli.main(["bench-classify", "--dataset", "mnist", "--data-dir",
                     str(tmp_path / "nowhere"), "--out", str(tmp_path)]) == 2
