"""The fitted posterior of a reconstruction, kept with its :class:`~ctuq.data.io.Result`
while the result is in memory (``result.posterior``).

A thin wrapper: it only calls the engine's ``draw`` (zero-mean weight-space
samples with the fitted hyperparameters) and ``predictive.image_samples``
(their image-space images ``J z``). Nothing here is written to a result file:
the fitted posterior holds the network and its linearisation.

Examples
--------
>>> result = ctuq.reconstruct(sinogram)                        # doctest: +SKIP
>>> more = result.posterior.sample(64)                         # [64, H, W]
>>> result.posterior.region_std((slice(10, 20), slice(5, 15)))  # std of the region's mean
"""

from __future__ import annotations

import numpy as np
import torch

from ctuq.errors import InputError

#: Samples per solver call when drawing (bounded memory, same numbers in any batch).
DRAW_BATCH = 32


class Posterior:
    """The linearised posterior of one 2-D reconstruction.

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

    def __init__(self, fitted, linearization, mean, *, seed: int = 0):
        self.fitted = fitted
        self.linearization = linearization
        self.mean = np.asarray(mean, dtype=np.float32)
        self._seed = int(seed)
        self._draws = 0

    @property
    def image_shape(self) -> tuple[int, int]:
        return tuple(self.mean.shape)

    def zero_mean_samples(self, n: int, *, seed: int | None = None) -> np.ndarray:
        """``n`` image-space posterior samples minus the mean, ``[n, H, W]`` float32."""
        from ctuq.recon import predictive

        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= 100_000:
            raise InputError(f"must be an integer from 1 to 100000, got {n!r}", field="n")
        if seed is None:  # fresh draws on every call, reproducible across a session
            seed = self._seed + 1000 + self._draws
            self._draws += 1
        gen = torch.Generator().manual_seed(int(seed))
        z = self.fitted.draw(int(n), generator=gen, batch_size=DRAW_BATCH)
        return predictive.image_samples(self.linearization, z).detach().cpu().numpy()

    def sample(self, n: int, *, seed: int | None = None) -> np.ndarray:
        """``n`` posterior image samples (mean + fluctuation), ``[n, H, W]`` float32.

        Parameters
        ----------
        n : int
        seed : int, optional
            Seed of the draws; default: a new seed on every call.
        """
        return self.mean + self.zero_mean_samples(n, seed=seed)

    def std(self, n: int = 128, *, seed: int | None = None) -> np.ndarray:
        """Per-pixel posterior std from ``n`` fresh samples, ``[H, W]``."""
        z = self.zero_mean_samples(n, seed=seed)
        return np.sqrt(np.mean(z.astype(np.float64) ** 2, axis=0)).astype(np.float32)

    def region_std(self, region, n: int = 128, *, seed: int | None = None) -> float:
        """Posterior std of the mean value over a region (pixel correlations included).

        Parameters
        ----------
        region : ndarray of bool, shape (H, W), or a tuple of slices
            The pixels to average.
        n : int
            Samples. Default 128.
        """
        mask = np.zeros(self.image_shape, dtype=bool)
        try:
            mask[region] = True
        except (IndexError, TypeError, ValueError) as exc:
            raise InputError(f"cannot select a region of {self.image_shape} with {region!r} "
                             f"({exc})", field="region") from None
        if not mask.any():
            raise InputError("the region is empty", field="region")
        z = self.zero_mean_samples(n, seed=seed)
        means = z[:, mask].astype(np.float64).mean(axis=1)
        return float(np.sqrt(np.mean(means ** 2)))

    def __repr__(self) -> str:
        return f"Posterior(image {self.image_shape[0]} x {self.image_shape[1]})"
