"""Test images, all made offline and deterministically from a seed.

Every phantom is a float32 array with values in ``[0, 1]``:

- :func:`shepp_logan` — the modified Shepp–Logan head (scikit-image's copy);
- :func:`ellipses` — random overlapping ellipses (the "ellipses" data set of
  the DIP literature);
- :func:`rectangles` — random rotated rectangles;
- :func:`digits` — scikit-learn's bundled 8×8 handwritten digits, resized to
  28×28 with a margin like MNIST: our offline stand-in for the KMNIST images
  of the reference papers.
"""

from __future__ import annotations

import functools

import numpy as np

from ctuq.errors import InputError

PHANTOMS = ("shepp", "ellipses", "rectangles", "digits")


def _check_size(size) -> int:
    if int(size) != size or size < 4:
        raise InputError(f"must be an integer >= 4, got {size!r}", field="size")
    return int(size)


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    # pixel centres on [-1, 1]; axis 0 is the first coordinate
    c = (np.arange(size) + 0.5) / size * 2 - 1
    return np.meshgrid(c, c, indexing="ij")


def _rotated(x0, x1, c0: float, c1: float, angle: float):
    """Grid coordinates in a frame centred at ``(c0, c1)`` and turned by ``angle``."""
    u = (x0 - c0) * np.cos(angle) + (x1 - c1) * np.sin(angle)
    v = -(x0 - c0) * np.sin(angle) + (x1 - c1) * np.cos(angle)
    return u, v


def shepp_logan(size: int = 128) -> np.ndarray:
    """Modified Shepp–Logan phantom.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.

    Returns
    -------
    ndarray of float32, shape (size, size)
        Values in [0, 1].

    Examples
    --------
    >>> shepp_logan(64).shape
    (64, 64)
    """
    from skimage.data import shepp_logan_phantom
    from skimage.transform import resize

    size = _check_size(size)
    img = shepp_logan_phantom()  # 400 x 400, float64 in [0, 1]
    img = resize(img, (size, size), order=1, anti_aliasing=True, mode="constant")
    return np.clip(img, 0, 1).astype(np.float32)


def ellipses(size: int = 128, seed: int = 0, n_ellipses: int | None = None) -> np.ndarray:
    """Random ellipses inside the disc inscribed in the image.

    Each ellipse adds a random value in [-0.4, 1] to the image; the sum is
    clipped below at 0 and scaled to a maximum of 1.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.
    seed : int, optional
        Seed of the random draw. Default 0.
    n_ellipses : int, optional
        Number of ellipses. Default: a random number in [10, 40).

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    size = _check_size(size)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(10, 40)) if n_ellipses is None else int(n_ellipses)
    x0, x1 = _grid(size)
    img = np.zeros((size, size))
    for _ in range(n):
        value = rng.uniform(-0.4, 1.0)
        a, b = rng.uniform(0.05, 0.4, size=2)
        r = rng.uniform(0, 0.7)
        phi = rng.uniform(0, 2 * np.pi)
        c0, c1 = r * np.cos(phi), r * np.sin(phi)
        u, v = _rotated(x0, x1, c0, c1, rng.uniform(0, np.pi))
        img[(u / a) ** 2 + (v / b) ** 2 <= 1] += value
    img = np.clip(img, 0, None)
    img[x0**2 + x1**2 > 1] = 0
    peak = img.max()
    return (img / peak if peak > 0 else img).astype(np.float32)


def rectangles(size: int = 128, seed: int = 0, n_rectangles: int | None = None) -> np.ndarray:
    """Random rotated rectangles with values in (0, 1], overlapping by maximum.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.
    seed : int, optional
        Seed of the random draw. Default 0.
    n_rectangles : int, optional
        Default: a random number in [3, 8).

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    size = _check_size(size)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8)) if n_rectangles is None else int(n_rectangles)
    x0, x1 = _grid(size)
    img = np.zeros((size, size))
    for _ in range(n):
        value = rng.uniform(0.2, 1.0)
        half = rng.uniform(0.05, 0.35, size=2)
        c = rng.uniform(-0.45, 0.45, size=2)
        u, v = _rotated(x0, x1, c[0], c[1], rng.uniform(0, np.pi))
        inside = (np.abs(u) <= half[0]) & (np.abs(v) <= half[1])
        img[inside] = np.maximum(img[inside], value)
    return img.astype(np.float32)


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images.astype(np.float64) / 16.0, d.target.astype(np.int64)


def digits(n: int = 1, size: int = 28, seed: int = 0, *, return_labels: bool = False):
    """Handwritten digits from scikit-learn, resized to ``size`` with a margin.

    The 8×8 digit is resized (bi-cubic, clipped to [0, 1]) to about 0.8·size
    and centred, like MNIST's 20×20 digits in a 28×28 frame.

    Parameters
    ----------
    n : int, optional
        How many digits. Default 1.
    size : int, optional
        Output side in pixels. Default 28.
    seed : int, optional
        Chooses which of the 1797 digits (a seeded permutation). Default 0.
    return_labels : bool, optional
        Also return the class labels.

    Returns
    -------
    images : ndarray of float32, shape (n, size, size)
    labels : ndarray of int64, shape (n,)
        Only if ``return_labels``.
    """
    from skimage.transform import resize

    size = _check_size(size)
    images, labels = _sklearn_digits()
    if not 1 <= n <= len(images):
        raise InputError(f"must be in [1, {len(images)}], got {n!r}", field="n")
    idx = np.random.default_rng(seed).permutation(len(images))[:n]
    inner = max(4, int(round(0.8 * size)))
    lo = (size - inner) // 2
    out = np.zeros((n, size, size), dtype=np.float32)
    for k, i in enumerate(idx):
        small = resize(images[i], (inner, inner), order=3, mode="edge", anti_aliasing=False)
        out[k, lo:lo + inner, lo:lo + inner] = np.clip(small, 0, 1)
    return (out, labels[idx]) if return_labels else out


def make_phantom(name: str, size: int, seed: int = 0) -> np.ndarray:
    """One phantom by name: ``'shepp'``, ``'ellipses'``, ``'rectangles'`` or ``'digits'``.

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    if name == "shepp":
        return shepp_logan(size)
    if name == "ellipses":
        return ellipses(size, seed)
    if name == "rectangles":
        return rectangles(size, seed)
    if name == "digits":
        return digits(1, size, seed)[0]
    raise InputError(f"unknown phantom {name!r}; choose one of {', '.join(PHANTOMS)}",
                     field="phantom")
