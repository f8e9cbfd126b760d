"""Baselines of the classification benchmark: MC dropout and laplace-torch (docs/method.md §11)."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from ctuq.errors import InputError

__all__ = ["mc_dropout_predict", "laplace_torch_available", "laplace_torch_fit",
           "LAPLACE_TORCH_SUBSETS", "LAPLACE_TORCH_STRUCTURES"]


def mc_dropout_predict(model: nn.Module, x: Tensor, n_samples: int = 100,
                       seed: int = 0) -> Tensor:
    """MC dropout: mean softmax over ``n_samples`` passes with dropout active, ``[n, C]``.

    Only the dropout modules are switched to training mode; the model is
    back in eval mode afterwards.
    """
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout | nn.Dropout2d)]
    if not drops or all(m.p == 0 for m in drops):
        raise InputError("the model has no active dropout layer", field="dropout")
    model.eval()
    for m in drops:
        m.train()
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(int(seed))
            acc = 0.0
            for _ in range(int(n_samples)):
                acc = acc + torch.softmax(model(x).double(), -1)
    finally:
        model.eval()
    return acc / int(n_samples)


def laplace_torch_available() -> bool:
    """Whether the optional ``laplace`` package (laplace-torch) imports here."""
    try:
        import laplace  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure (e.g. a CUDA-only torchvision)
        return False
    return True


LAPLACE_TORCH_SUBSETS = ("all", "last_layer")
LAPLACE_TORCH_STRUCTURES = ("full", "kron", "diag")


def laplace_torch_fit(model: nn.Module, x_train: Tensor, y_train: Tensor,
                      *, subset: str = "all", structure: str = "full",
                      prior_structure: str | None = None,
                      batch_size: int = 256) -> tuple:
    """laplace-torch's GGN Laplace, prior precision by its marginal likelihood, probit predictive.

    An independent implementation of the same linearised Laplace (``subset='all',
    structure='full'`` is :class:`ExactLLA`'s posterior up to the prior's
    parametrisation), and, with ``subset='last_layer', structure='kron'``, the
    library's default recipe.

    Parameters
    ----------
    model : nn.Module
        The trained classifier (not modified).
    x_train : Tensor, shape (N, 1, H, W)
    y_train : Tensor, shape (N,)
    subset : {'all', 'last_layer'}, optional
        Weights of the Laplace. Default ``'all'``.
    structure : {'full', 'kron', 'diag'}, optional
        GGN approximation. Default ``'full'``.
    prior_structure : {'scalar', 'layerwise', 'diag'}, optional
        Prior precisions tuned by laplace-torch's marginal likelihood (Adam, 100
        steps). Default ``'layerwise'`` (one per parameter tensor, closest to
        ctuq's layer-wise ARD) for ``subset='all'``, ``'scalar'`` for the last
        layer (laplace-torch's last-layer Laplace takes no layer-wise prior).
    batch_size : int, optional
        Images per batch of the GGN fit and of the predictive. Default 256.

    Returns
    -------
    predict : callable
        ``predict(x)``: ``[n, C]`` float64 probabilities for inputs ``[n, 1, H, W]``.
    info : dict
        ``subset``, ``structure``, ``prior_structure``, ``prior_precision`` (mean),
        ``prior_precisions`` (list), ``log_marglik``, ``version``.

    Raises
    ------
    InputError
        When laplace-torch does not import, or for an unknown ``subset`` / ``structure``.
    """
    if subset not in LAPLACE_TORCH_SUBSETS:
        raise InputError(f"must be one of {', '.join(LAPLACE_TORCH_SUBSETS)}, got {subset!r}",
                         field="subset")
    if structure not in LAPLACE_TORCH_STRUCTURES:
        raise InputError(f"must be one of {', '.join(LAPLACE_TORCH_STRUCTURES)}, "
                         f"got {structure!r}", field="structure")
    if not laplace_torch_available():
        raise InputError("laplace-torch is not installed or does not import here (see "
                         "docs/classification.md: install it without torchvision)",
                         field="methods")
    import laplace

    # laplace-torch wraps the model (hooks, a feature extractor): give it a copy
    net = copy.deepcopy(model).eval()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_train, y_train),
                                         batch_size=batch_size)
    la = laplace.Laplace(net, "classification", subset_of_weights=subset,
                         hessian_structure=structure)
    prior_structure = prior_structure or ("layerwise" if subset == "all" else "scalar")
    la.fit(loader, progress_bar=False)
    with warnings.catch_warnings():  # it warns on every call that probit is its default
        warnings.filterwarnings("ignore", message="By default `link_approx`")
        la.optimize_prior_precision(pred_type="glm", method="marglik",
                                    prior_structure=prior_structure, link_approx="probit")
    def predict(x: Tensor) -> Tensor:
        # no torch.no_grad(): the GLM predictive takes Jacobians by autograd; in chunks,
        # since a chunk's Jacobian holds n × C × P numbers (2000 × 10 × 25k: 2 GB)
        return torch.cat([la(x[i:i + batch_size], pred_type="glm", link_approx="probit")
                          .detach().double() for i in range(0, x.shape[0], batch_size)])

    prec = torch.as_tensor(la.prior_precision).detach().double().reshape(-1)
    return predict, {"subset": subset, "structure": structure,
                   "prior_structure": prior_structure,
                   "prior_precision": float(prec.mean()), "prior_precisions": prec.tolist(),
                   "log_marglik": float(la.log_marginal_likelihood()),
                   "version": getattr(laplace, "__version__", "unknown")}
