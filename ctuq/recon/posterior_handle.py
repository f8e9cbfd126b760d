"""The fitted posterior of a reconstruction, kept with its :class:`~ctuq.data.io.Result`
while the result is in memory (``result.posterior``).

:class:`PosteriorHandle` is the one interface of every uncertainty method's
posterior (:mod:`ctuq.recon.methods`): a method supplies zero-mean draws of
its posterior (:meth:`PosteriorHandle.fluctuations`), the handle adds the
reconstruction and, by default, the model error (:mod:`ctuq.recon.model_error`),
so that samples and region error bars carry the same total variance as the
result's ``std``:

* the posterior part comes from fresh draws of the method's posterior;
* the model-error part is diagonal in image space, ``δ ~ N(0, diag(v_me))``:
  a sample gets independent Gaussian pixel noise of that variance, and the
  variance of a region's mean gets ``Σ_R v_me / |R|²`` exactly.

Nothing here is written to a result file: the posterior holds the network.

Examples
--------
>>> result = ctuq.reconstruct(sinogram)                        # doctest: +SKIP
>>> more = result.posterior.sample(64)                         # [64, H, W], total variance
>>> result.posterior.region_std((slice(10, 20), slice(5, 15)))  # std of the region's mean
>>> result.posterior.sample(8, include_model_error=False)      # the posterior alone
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ctuq.errors import InputError

__all__ = ["PosteriorHandle", "LinearisedPosterior", "ScaledPosterior", "Posterior",
           "DRAW_BATCH", "REGION_SAMPLES"]

#: Samples per solver call when drawing (bounded memory, same numbers in any batch).
DRAW_BATCH = 32
#: Default posterior samples of :meth:`PosteriorHandle.region_std`: the std of
#: the region mean's posterior part then has a Monte-Carlo relative error of
#: about ``1/√(2n)`` = 12.5 %, which moves the total std (posterior ⊕ model
#: error, the model error exact) by far less wherever the model error is a
#: sizeable part of the variance; one batch of draws (:data:`DRAW_BATCH`).
REGION_SAMPLES = 32


class PosteriorHandle:
    """The posterior of one 2-D reconstruction, behind one interface.

    Subclasses implement :meth:`fluctuations` (and, when their samples are
    not ``mean + fluctuation``, :meth:`posterior_draws`).

    Parameters
    ----------
    mean : ndarray, shape (H, W)
        The reconstruction shown (the samples' centre).
    seed : int
        Base seed of the draws when no seed is given.
    model_error_variance : ndarray, shape (H, W), optional
        The model-error variance (set by the pipeline after its model-error
        stage). Default None: none.

    Attributes
    ----------
    min_samples : int
        Fewest samples a call takes (2 where the centre is estimated from
        the samples themselves).
    """

    min_samples = 1

    def __init__(self, mean, *, seed: int = 0, model_error_variance=None):
        self.mean = np.asarray(mean, dtype=np.float32)
        self._seed = int(seed)
        self._draws = 0
        self._last_draws = None  # (n, seed, draws): several regions of one explicit seed
        self.model_error_variance = None
        if model_error_variance is not None:
            self.set_model_error(model_error_variance)

    # -- what a method supplies -----------------------------------------------------
    def fluctuations(self, n: int, seed: int) -> np.ndarray:
        """``n`` zero-mean posterior draws in image space, ``[n, H, W]``."""
        raise NotImplementedError

    def posterior_draws(self, n: int, seed: int) -> np.ndarray:
        """``n`` posterior samples without the model error, ``[n, H, W]``."""
        return self.mean + self.fluctuations(n, seed)

    # -- the interface ------------------------------------------------------------------
    @property
    def image_shape(self) -> tuple[int, int]:
        return tuple(self.mean.shape)

    def set_model_error(self, variance) -> None:
        """The model-error variance ``(H, W)`` that samples and region stds include."""
        v = np.asarray(variance, dtype=np.float64)
        if v.shape != self.image_shape or not np.all(np.isfinite(v)) or (v < 0).any():
            raise InputError(f"must be a finite, non-negative {self.image_shape} map",
                             field="model_error_variance")
        self.model_error_variance = v

    def _check_n(self, n) -> int:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) \
                or not self.min_samples <= n <= 100_000:
            raise InputError(f"must be an integer from {self.min_samples} to 100000, got "
                             f"{n!r}", field="n")
        return int(n)

    def _next_seed(self, seed: int | None) -> int:
        if seed is None:  # fresh draws on every call, reproducible across a session
            seed = self._seed + 1000 + self._draws
            self._draws += 1
        return int(seed)

    def _model_error_noise(self, n: int, seed: int) -> np.ndarray:
        if self.model_error_variance is None:
            return np.zeros((n, *self.image_shape), dtype=np.float32)
        rng = np.random.default_rng([seed, 0x6D65])  # not the posterior draws' stream
        return (rng.standard_normal((n, *self.image_shape))
                * np.sqrt(self.model_error_variance)).astype(np.float32)

    def zero_mean_samples(self, n: int, *, seed: int | None = None,
                          include_model_error: bool = False) -> np.ndarray:
        """``n`` samples minus the centre, ``[n, H, W]`` float32.

        Parameters
        ----------
        n : int
        seed : int, optional
            Default: a new seed on every call.
        include_model_error : bool
            Add the model-error noise. Default False (the posterior's part).
        """
        explicit = seed is not None
        n, seed = self._check_n(n), self._next_seed(seed)
        if explicit and self._last_draws is not None and self._last_draws[:2] == (n, seed):
            z = self._last_draws[2]  # the same draws again, without the solves
        else:
            z = np.asarray(self.fluctuations(n, seed), dtype=np.float32)
            if explicit:  # one entry (n·H·W floats): a user's regions of one result, one seed
                self._last_draws = (n, seed, z)
        if include_model_error:
            return z + self._model_error_noise(n, seed)
        return z.copy() if explicit else z  # a caller's edits must not reach the kept draws

    def sample(self, n: int, *, seed: int | None = None,
               include_model_error: bool = True) -> np.ndarray:
        """``n`` image samples, ``[n, H, W]`` float32.

        Parameters
        ----------
        n : int
        seed : int, optional
            Seed of the draws; default: a new seed on every call.
        include_model_error : bool
            Add independent Gaussian pixel noise with the model-error
            variance, so that the samples' variance is the result's total
            ``variance``. Default True; False: the posterior's samples alone
            (their variance is the result's ``posterior_std²``).
        """
        n, seed = self._check_n(n), self._next_seed(seed)
        x = np.asarray(self.posterior_draws(n, seed), dtype=np.float32)
        return x + self._model_error_noise(n, seed) if include_model_error else x

    def std(self, n: int = 64, *, seed: int | None = None,
            include_model_error: bool = True) -> np.ndarray:
        """Per-pixel std from ``n`` fresh posterior samples ⊕ the exact model error, ``[H, W]``."""
        z = self.zero_mean_samples(n, seed=seed).astype(np.float64)
        var = np.mean(z**2, axis=0)
        if include_model_error and self.model_error_variance is not None:
            var = var + self.model_error_variance
        return np.sqrt(var).astype(np.float32)

    def _mask(self, region) -> np.ndarray:
        mask = np.zeros(self.image_shape, dtype=bool)
        try:
            mask[region] = True
        except (IndexError, TypeError, ValueError) as exc:
            raise InputError(f"cannot select a region of {self.image_shape} with {region!r} "
                             f"({exc})", field="region") from None
        if not mask.any():
            raise InputError("the region is empty", field="region")
        return mask

    def region_std_parts(self, region, n: int = REGION_SAMPLES, *,
                         seed: int | None = None) -> dict[str, float]:
        """The std of a region's mean value and its parts.

        Parameters
        ----------
        region : ndarray of bool, shape (H, W), or a tuple of slices
        n : int
            Posterior samples. Default :data:`REGION_SAMPLES` (32).

        Returns
        -------
        dict
            ``posterior`` (the std of the region mean over the posterior
            samples, pixel correlations included), ``model_error`` (exact:
            ``√(Σ_R v_me) / |R|``, the model error being independent per
            pixel), ``total`` (the two in quadrature) and
            ``posterior_relative_error`` (Monte-Carlo relative error of the
            posterior part, ``1/√(2n)``).
        """
        mask = self._mask(region)
        z = self.zero_mean_samples(n, seed=seed)
        means = z[:, mask].astype(np.float64).mean(axis=1)
        post_var = float(np.mean(means**2))
        me_var = 0.0
        if self.model_error_variance is not None:
            me_var = float(self.model_error_variance[mask].sum()) / float(mask.sum()) ** 2
        return {"posterior": math.sqrt(post_var), "model_error": math.sqrt(me_var),
                "total": math.sqrt(post_var + me_var),
                "posterior_relative_error": 1.0 / math.sqrt(2.0 * len(means))}

    def region_std(self, region, n: int = REGION_SAMPLES, *, seed: int | None = None,
                   include_model_error: bool = True) -> float:
        """Std of the mean value over a region (pixel correlations included).

        The posterior part from ``n`` samples (Monte-Carlo relative error
        ``1/√(2n)``, 12.5 % at the default 32), the model-error part exact
        (:meth:`region_std_parts`).

        Parameters
        ----------
        region : ndarray of bool, shape (H, W), or a tuple of slices
            The pixels to average.
        n : int
            Posterior samples. Default :data:`REGION_SAMPLES`.
        seed : int, optional
            Seed of the draws. The last explicitly seeded draws are kept, so
            further regions with the same ``seed`` and ``n`` cost no solves.
            Default: new draws on every call.
        include_model_error : bool
            Default True; False: the posterior's part alone.
        """
        parts = self.region_std_parts(region, n, seed=seed)
        return parts["total"] if include_model_error else parts["posterior"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(image {self.image_shape[0]} x {self.image_shape[1]})"


class LinearisedPosterior(PosteriorHandle):
    """The linearised Laplace posterior of one 2-D reconstruction.

    A thin wrapper: it only calls the engine's ``draw`` (zero-mean weight-space
    samples with the fitted hyperparameters) and ``predictive.image_samples``
    (their image-space images ``J z``).

    Parameters
    ----------
    fitted : object
        The engine's fitted posterior (has ``draw(k, generator=, batch_size=)``).
    linearization : object
        The linearisation at the fitted weights (for ``image_samples``).
    mean : ndarray, shape (H, W)
        The posterior mean (the reconstruction).
    seed : int
        Base seed of :meth:`sample`'s draws when no seed is given.
    """

    def __init__(self, fitted, linearization, mean, *, seed: int = 0,
                 model_error_variance=None):
        super().__init__(mean, seed=seed, model_error_variance=model_error_variance)
        self.fitted = fitted
        self.linearization = linearization

    def fluctuations(self, n: int, seed: int) -> np.ndarray:
        from ctuq.recon import predictive

        gen = torch.Generator().manual_seed(int(seed))
        z = self.fitted.draw(int(n), generator=gen, batch_size=DRAW_BATCH)
        return predictive.image_samples(self.linearization, z).detach().cpu().numpy()


class ScaledPosterior(PosteriorHandle):
    """Another handle's posterior in data units: its images multiplied by ``scale``.

    The pipeline fits data divided by their scale ``s``
    (:mod:`ctuq.recon.scaling`); this handle gives the draws of that fit
    times ``s``. The model error is set in data units (its variance already
    carries ``s²``).

    Parameters
    ----------
    inner : PosteriorHandle
        The posterior of the normalised problem (its model error unset).
    scale : float
        ``s`` (> 0).
    """

    def __init__(self, inner: PosteriorHandle, scale: float, *, model_error_variance=None):
        self.inner, self.scale = inner, float(scale)
        self.min_samples = inner.min_samples
        super().__init__(np.asarray(inner.mean, np.float64) * self.scale, seed=inner._seed,
                         model_error_variance=model_error_variance)

    def fluctuations(self, n: int, seed: int) -> np.ndarray:
        return np.asarray(self.inner.fluctuations(n, seed), np.float32) * np.float32(self.scale)

    def posterior_draws(self, n: int, seed: int) -> np.ndarray:
        return np.asarray(self.inner.posterior_draws(n, seed), np.float32) * np.float32(self.scale)

    def __getattr__(self, name: str):
        # what a method's own handle offers beyond the interface (e.g. ``fitted``)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


#: The name of :class:`LinearisedPosterior` before other methods had handles.
Posterior = LinearisedPosterior
