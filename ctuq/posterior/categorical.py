"""The categorical likelihood of a classifier, linearised at its MAP weights (docs/method.md §3).

For logits ``f(x, θ)`` (``[N, C]``) and labels ``y``, the generalised
Gauss–Newton matrix of the cross-entropy at ``θ̂`` is

    G = Σ_n J_nᵀ Λ_n J_n,   Λ_n = diag(p_n) − p_n p_nᵀ,   p_n = softmax f(x_n, θ̂),

and ``Λ_n = B_nᵀ B_n`` with ``B_n = diag(√p_n) − √p_n p_nᵀ`` (because
``Σ_c p_c = 1``). :class:`CategoricalLikelihood` is therefore the engine's
likelihood with ``Φ = B J`` (``N·C × d_θ``), no data target (the post-hoc
Laplace posterior is centred on ``θ̂``; see ``mode``) and no noise
parameter (``σ² = 1``); its mini-batch axis is the data points.

:class:`ClassifierLinearization` is the :class:`~ctuq.posterior.linearize.Linearization`
whose products take the input batch as an argument.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import jacrev, jvp, vjp

from ctuq.posterior.likelihood import Likelihood
from ctuq.posterior.linearize import Linearization, in_full_float32

__all__ = ["ClassifierLinearization", "CategoricalLikelihood", "lambda_mul", "b_mul",
           "bt_mul", "b_mul_jacobian"]


class ClassifierLinearization(Linearization):
    """Jacobian products of a classifier at its MAP weights, for any input batch.

    A :class:`~ctuq.posterior.linearize.Linearization` over all trainable
    parameters (default ``param_filter='all'``, one prior block per layer via
    the model's ``blocks()``) or a subset of them, whose products take the
    inputs as an argument.

    Parameters
    ----------
    model : nn.Module
        The trained classifier (put in eval mode: dropout off).
    example_input : Tensor, shape (n, 1, H, W)
        Any input batch of the right shape (only its first image is used to
        fix the layout).
    param_filter : 'all' or callable, optional
        Which parameters are linearised (the rest stay fixed at the MAP):
        ``'all'`` (default) or ``(name, parameter) -> bool``, e.g. a
        last-layer filter.
    chunk_size : int or None, optional
        Most vectors per ``vmap``-ed product. Default None (all).
    data_chunk : int, optional
        Most inputs per network call in :meth:`logits`, :meth:`jacobian` and
        the full-data products of :class:`CategoricalLikelihood`. Default 2048.

    Attributes
    ----------
    num_classes : int
        ``C``.
    """

    def __init__(self, model: nn.Module, example_input: Tensor, *, param_filter="all",
                 chunk_size: int | None = None, data_chunk: int = 2048):
        super().__init__(model, example_input[:1], param_filter=param_filter,
                         chunk_size=chunk_size)
        self.num_classes = int(self.out_shape[-1])
        self.data_chunk = max(1, int(data_chunk))

    def _fn(self, x: Tensor, fixed=None):
        return lambda th: self._f_raw(th, fixed, x)

    @in_full_float32
    @torch.no_grad()
    def logits(self, x: Tensor) -> Tensor:
        """``f(x, θ̂)``, ``[n, C]`` (float32)."""
        x = x.to(self.device)
        return torch.cat([self._f_raw(self.theta_hat, None, x[i:i + self.data_chunk])
                          for i in range(0, x.shape[0], self.data_chunk)])

    def probs(self, x: Tensor) -> Tensor:
        """``softmax f(x, θ̂)``, ``[n, C]``."""
        return torch.softmax(self.logits(x), -1)

    @in_full_float32
    def jvp_at(self, v: Tensor, x: Tensor) -> Tensor:
        """``J(x) v``: ``[k, d_θ]`` → ``[k, n, C]``."""
        f = self._fn(x.to(self.device))
        v = v.reshape(-1, self.num_params).to(self.dtype)
        one = lambda vi: jvp(f, (self.theta_hat,), (vi,))[1]  # noqa: E731
        with torch.no_grad():
            return torch.cat([self._batched(one, c) for c in self._chunks(v)])

    @in_full_float32
    def vjp_at(self, u: Tensor, x: Tensor) -> Tensor:
        """``J(x)ᵀ u``: ``[k, n, C]`` → ``[k, d_θ]``."""
        _, fn = vjp(self._fn(x.to(self.device)), self.theta_hat)
        u = u.to(self.dtype)
        with torch.no_grad():
            return torch.cat([self._batched(lambda ui: fn(ui)[0], c) for c in self._chunks(u)])

    @in_full_float32
    def jacobian(self, x: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
        """The dense ``J(x)``, ``[n, C, d_θ]`` (``float64`` recomputes the net in double)."""
        fixed = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self._fixed.items()}
        th = self.theta_hat.to(dtype)
        outs = []
        for i in range(0, x.shape[0], max(1, self.data_chunk // 8)):
            xi = x[i:i + max(1, self.data_chunk // 8)].to(self.device, dtype)
            outs.append(jacrev(self._fn(xi, fixed))(th).detach())
        return torch.cat(outs)


def lambda_mul(p: Tensor, r: Tensor) -> Tensor:
    """``Λ_n r_n = p_n ⊙ r_n − p_n (p_nᵀ r_n)`` for ``p`` ``[n, C]``, ``r`` ``[..., n, C]``."""
    return p * r - p * (p * r).sum(-1, keepdim=True)


def b_mul(p: Tensor, r: Tensor) -> Tensor:
    """``B_n r_n = √p_n ⊙ r_n − √p_n (p_nᵀ r_n)`` (``Λ_n = B_nᵀ B_n``)."""
    s = p.clamp_min(0).sqrt()
    return s * r - s * (p * r).sum(-1, keepdim=True)


def bt_mul(p: Tensor, e: Tensor) -> Tensor:
    """``B_nᵀ e_n = √p_n ⊙ e_n − p_n (√p_nᵀ e_n)``."""
    s = p.clamp_min(0).sqrt()
    return s * e - p * (s * e).sum(-1, keepdim=True)


def b_mul_jacobian(p: Tensor, J: Tensor) -> Tensor:
    """``B_n J_n`` for ``p`` ``[n, C]`` and dense ``J`` ``[n, C, d]``."""
    s = p.sqrt().unsqueeze(-1)
    return s * J - s * torch.einsum("nc,ncd->nd", p, J).unsqueeze(1)


class CategoricalLikelihood(Likelihood):
    """The categorical likelihood linearised at ``θ̂``: ``Φ = B J`` over the training inputs.

    Parameters
    ----------
    clin : ClassifierLinearization
    x : Tensor, shape (N, 1, H, W)
        Training inputs.
    probs : Tensor, shape (N, C), optional
        ``p_n``, the probabilities the GGN is taken at. Default ``softmax f(x, θ̂)``.

    Notes
    -----
    ``normal`` applies ``Λ_n`` directly (``Jᵀ Λ J v``), not ``BᵀB``; the
    full-data products run in chunks of ``clin.data_chunk`` inputs. A
    sampler's mini-batches are epochs of a random permutation of the data
    points. :meth:`set_mode` moves the posterior's centre (and the GGN's
    ``p_n``) to the linear model's own mode.
    """

    batch_axis = "data points"

    def __init__(self, clin: ClassifierLinearization, x: Tensor, probs: Tensor | None = None):
        self.lin = clin
        self.x = x.to(clin.device)
        self.probs = (clin.probs(self.x) if probs is None else probs).to(clin.device)
        self.obs_shape = tuple(int(s) for s in self.probs.shape)
        self.num_observations = int(self.obs_shape[0])
        self._mode = clin.theta_hat

    @property
    def mode(self) -> Tensor:
        return self._mode

    def set_mode(self, theta: Tensor, probs: Tensor) -> None:
        """Centre the posterior on ``theta`` with the GGN at ``probs`` (``[N, C]``)."""
        self._mode = theta
        self.probs = probs.to(self.lin.device)

    def _chunks(self, idx: Tensor | None):
        """``(inputs, probs, slice of the batch axis or None)`` per data chunk."""
        if idx is not None:
            yield self.x[idx], self.probs[idx], None
            return
        step = self.lin.data_chunk
        for i in range(0, self.x.shape[0], step):
            sl = slice(i, i + step)
            yield self.x[sl], self.probs[sl], sl

    def phi(self, v: Tensor, idx: Tensor | None = None) -> Tensor:
        """``B J v``: ``[k, d_θ]`` → ``[k, |S|, C]``."""
        return torch.cat([b_mul(p, self.lin.jvp_at(v, xs)) for xs, p, _ in self._chunks(idx)],
                         dim=1)

    def phi_t(self, u: Tensor, idx: Tensor | None = None) -> Tensor:
        """``Jᵀ Bᵀ u``: ``[k, |S|, C]`` → ``[k, d_θ]`` (a sum over the data chunks)."""
        out = torch.zeros(u.shape[0], self.num_params, device=self.device)
        for xs, p, sl in self._chunks(idx):
            out += self.lin.vjp_at(bt_mul(p, u if sl is None else u[:, sl]), xs)
        return out

    def normal(self, v: Tensor, idx: Tensor | None = None,
               target: Tensor | None = None) -> Tensor:
        """``Jᵀ Λ J v`` (summed over the data chunks); there is no target."""
        out = torch.zeros_like(v)
        for xs, p, _ in self._chunks(idx):
            out += self.lin.vjp_at(lambda_mul(p, self.lin.jvp_at(v, xs)), xs)
        return out

    def _diag_normal_exact(self) -> Tensor:
        acc = torch.zeros(self.num_params, dtype=torch.float64)
        clin = self.lin
        for i in range(0, self.x.shape[0], clin.data_chunk):
            J = clin.jacobian(self.x[i:i + clin.data_chunk], torch.float64)  # [n, C, d]
            p = self.probs[i:i + clin.data_chunk].double()
            acc += b_mul_jacobian(p, J).square().sum((0, 1)).cpu()
        return acc
