"""napari sample data: simulated sinograms with their ground truth.

Both are simulated in code at every call (nothing is downloaded): a
parallel-beam sinogram of a phantom with 5 % Gaussian noise (seed 0), as a
sinogram layer that the reconstruction widget can use at once (geometry and
noise level in its metadata) and a ground-truth layer.
"""

from __future__ import annotations

from ctuq.app._reader import sinogram_layers


def simulated_sinogram(truth, n_angles: int, *, phantom: str, noise_level: float = 0.05,
                       seed: int = 0):
    """A noisy parallel-beam :class:`~ctuq.data.io.Sinogram` of ``truth``.

    Parameters
    ----------
    truth : ndarray, shape (n, n)
    n_angles : int
        Equispaced angles over 180°.
    phantom : str
        Recorded in ``meta['phantom']``.
    noise_level : float
        Gaussian noise std relative to mean ``|A x|``. Default 0.05.
    seed : int
        Seed of the noise. Default 0.
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.simulate import simulate_sinogram

    geometry = Geometry.parallel(truth.shape[-1], n_angles)
    y, sigma = simulate_sinogram(truth, RayTransform(geometry), noise_level, seed=seed)
    meta = {"phantom": phantom, "noise_level": noise_level, "noise_std": sigma, "seed": seed,
            "source": f"simulated ({phantom})"}
    return Sinogram(y.cpu().numpy(), geometry, meta, ground_truth=truth)


def shepp_logan_sample() -> list:
    """Shepp–Logan phantom, 64², 60 angles: the sinogram and its truth."""
    from ctuq.data.phantoms import shepp_logan

    return sinogram_layers(simulated_sinogram(shepp_logan(64), 60, phantom="shepp"),
                           "shepp_logan")


def digit_sample() -> list:
    """A handwritten digit (scikit-learn's), 28², 20 angles: the sinogram and its truth."""
    from ctuq.data.phantoms import digits

    return sinogram_layers(simulated_sinogram(digits(1, 28, seed=0)[0], 20, phantom="digit"),
                           "digit")
