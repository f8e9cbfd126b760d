"""laplace-torch as an independent check of ctuq's exact linearised Laplace.

laplace-torch is optional (``make install`` puts it in the venv without torchvision,
which has no CPU build); these tests skip where it does not import.
"""

from __future__ import annotations

import math

import pytest
import torch

from ctuq.errors import InputError
from ctuq.models.classifiers import build_classifier
import ctuq.classify as C

laplace = pytest.importorskip("laplace")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fitted():
    """A tiny trained MLP, ctuq's exact LLA and laplace-torch's full-GGN Laplace, same prior."""
    g = torch.Generator().manual_seed(1)
    means = torch.rand(3, 1, 4, 4, generator=g)
    y = torch.arange(90) % 3
    x = means[y] + 0.35 * torch.randn(90, 1, 4, 4, generator=g)
    net = build_classifier("mlp", (1, 4, 4), 3, hidden=(6,), seed=0)
    C.train_map(net, x, y, epochs=60, lr=1e-2, batch_size=32, prior_precision=1.0)
    clin = C.ClassifierLinearization(net, x)
    exact = C.ExactLLA(clin, x, y)
    precision = 2.5
    prior = C.build_prior(clin, x, "ard", variance=1.0 / precision)
    la = laplace.Laplace(net, "classification", subset_of_weights="all",
                         hessian_structure="full", prior_precision=precision)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32))
    return x, y, net, exact, prior, la, precision


def test_ggn_agrees_with_laplace_torch(fitted):
    *_, exact, prior, la, _ = fitted
    H = la.H.double()
    assert H.shape == exact.G.shape
    torch.testing.assert_close(H, exact.G, rtol=1e-4, atol=1e-4 * float(exact.G.abs().max()))


def test_log_evidence_agrees_with_laplace_torch(fitted):
    *_, exact, prior, la, precision = fitted
    ours = float(exact.log_evidence(torch.full((prior.num_blocks,), -math.log(precision),
                                               dtype=torch.float64), prior))
    theirs = float(la.log_marginal_likelihood())
    assert abs(ours - theirs) <= 1e-3 * abs(ours), (ours, theirs)
    # and it is a function of the precision: a different one moves both the same way
    other = float(la.log_marginal_likelihood(torch.tensor(precision * 4.0)))
    ours4 = float(exact.log_evidence(torch.full((prior.num_blocks,), -math.log(4 * precision),
                                                dtype=torch.float64), prior))
    assert abs(ours4 - other) <= 1e-3 * abs(ours4) and abs(ours4 - ours) > 0.1
    la.prior_precision = precision  # log_marginal_likelihood(p) sets it: restore for the others


def test_probit_predictive_agrees_with_laplace_torch(fitted):
    x, _, _, exact, prior, la, precision = fitted
    assert float(la.prior_precision) == precision
    ours = exact.predict(prior, x[:20], "probit")
    theirs = la(x[:20], pred_type="glm", link_approx="probit").double()
    torch.testing.assert_close(theirs, ours, rtol=0, atol=2e-5)


def test_laplace_torch_fit_recipes():
    g = torch.Generator().manual_seed(2)
    x = torch.rand(60, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 8).long()
    net = build_classifier("mlp", (1, 4, 4), 2, hidden=(5,), seed=0)
    C.train_map(net, x, y, epochs=20, lr=1e-2)
    before = [p.detach().clone() for p in net.parameters()]
    for subset, structure in (("all", "full"), ("last_layer", "kron")):
        predict, info = C.laplace_torch_fit(net, x, y, subset=subset, structure=structure)
        probs = [predict(x[:7]), predict(x[7:9])]
        assert [p.shape for p in probs] == [(7, 2), (2, 2)]
        assert all(torch.allclose(p.sum(-1), torch.ones(len(p), dtype=p.dtype)) for p in probs)
        assert info["prior_precision"] > 0 and info["subset"] == subset
    # the network the other methods share is left as it was
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    with pytest.raises(InputError, match="subset"):
        C.laplace_torch_fit(net, x, y, subset="middle")
    with pytest.raises(InputError, match="structure"):
        C.laplace_torch_fit(net, x, y, structure="lowrank")
