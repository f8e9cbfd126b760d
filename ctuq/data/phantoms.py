"""Test images, all made offline and deterministically from a seed.

Every phantom is a float32 array with values in ``[0, 1]``:

- :func:`shepp_logan` — the modified Shepp–Logan head (scikit-image's copy);
- :func:`ellipses` — random overlapping ellipses (the "ellipses" data set of
  the DIP literature);
- :func:`rectangles` — random rotated rectangles;
- :func:`digits` — scikit-learn's bundled 8×8 handwritten digits, resized to
  28×28 with a margin like MNIST: our offline stand-in for the KMNIST images
  of the reference papers;
- :func:`shepp_variant` — the Shepp–Logan head with every ellipse jittered
  (position, axes, angle, intensity) and the whole head turned and scaled;
- :func:`natural_crop` — a random square crop of one of scikit-image's
  bundled photographs, in grey levels (a family no preset was tuned on).

Which seeds and families serve tuning, validation and testing is fixed in
:mod:`ctuq.data.splits`.
"""

from __future__ import annotations

import functools

import numpy as np

from ctuq.errors import InputError

PHANTOMS = ("shepp", "shepp-variant", "ellipses", "rectangles", "digits", "natural")


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
    size = _check_size(size)
    images, labels = _sklearn_digits()
    if not 1 <= n <= len(images):
        raise InputError(f"must be in [1, {len(images)}], got {n!r}", field="n")
    idx = np.random.default_rng(seed).permutation(len(images))[:n]
    out = np.stack([_framed_digit(images[i], size) for i in idx])
    return (out, labels[idx]) if return_labels else out


def _framed_digit(small: np.ndarray, size: int) -> np.ndarray:
    """An 8×8 digit resized (bi-cubic) to about 0.8·size and centred in a size² frame."""
    from skimage.transform import resize

    inner = max(4, int(round(0.8 * size)))
    lo = (size - inner) // 2
    out = np.zeros((size, size), dtype=np.float32)
    big = resize(small, (inner, inner), order=3, mode="edge", anti_aliasing=False)
    out[lo:lo + inner, lo:lo + inner] = np.clip(big, 0, 1)
    return out


def make_phantom(name: str, size: int, seed: int = 0) -> np.ndarray:
    """One phantom by name, one of :data:`PHANTOMS`.

    ``'shepp'`` ignores the seed; ``'digits'`` takes the first digit of the
    seed's permutation (:func:`digits`).

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
    if name == "shepp-variant":
        return shepp_variant(size, seed)
    if name == "natural":
        return natural_crop(size, seed)
    raise InputError(f"unknown phantom {name!r}; choose one of {', '.join(PHANTOMS)}",
                     field="phantom")


# -- families for benchmarks (see ctuq.data.splits) ---------------------------------

#: The modified Shepp–Logan head as ellipses: (value, semi-axis 0, semi-axis 1,
#: centre 0, centre 1, angle in degrees) on [-1, 1]², axis 0 pointing down the
#: image (Toft's table with the first coordinate as the vertical one).
_SHEPP_ELLIPSES = (
    (1.0, 0.69, 0.92, 0.0, 0.0, 0),
    (-0.8, 0.6624, 0.874, 0.0184, 0.0, 0),
    (-0.2, 0.11, 0.31, 0.0, 0.22, -18),
    (-0.2, 0.16, 0.41, 0.0, -0.22, 18),
    (0.1, 0.21, 0.25, -0.35, 0.0, 0),
    (0.1, 0.046, 0.046, -0.1, 0.0, 0),
    (0.1, 0.046, 0.046, 0.1, 0.0, 0),
    (0.1, 0.046, 0.023, 0.605, 0.08, 0),
    (0.1, 0.023, 0.023, 0.606, 0.0, 0),
    (0.1, 0.023, 0.046, 0.605, -0.06, 0),
)


def shepp_variant(size: int = 128, seed: int = 0) -> np.ndarray:
    """A Shepp–Logan-like head: every ellipse jittered, the head turned and scaled.

    Skull and brain are stretched together (each axis by up to ±15 %); every
    inner ellipse's centre moves by up to 0.04, its semi-axes change by up to
    ±15 %, its angle by up to ±15° and its value by up to ±30 %; the head is
    then turned by an angle in [0°, 360°) and scaled by a factor in
    [0.75, 0.95]. The image is clipped to [0, 1] and scaled to a maximum of 1.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.
    seed : int, optional
        Seed of the jitter. Default 0.

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    size = _check_size(size)
    rng = np.random.default_rng(seed)
    turn, scale = rng.uniform(0, 2 * np.pi), rng.uniform(0.75, 0.95)
    x0, x1 = _grid(size)
    # coordinates of the unturned, unscaled head
    h0 = (x0 * np.cos(turn) + x1 * np.sin(turn)) / scale
    h1 = (-x0 * np.sin(turn) + x1 * np.cos(turn)) / scale
    img = np.zeros((size, size))
    head = rng.uniform(0.85, 1.15, size=2)  # skull and brain share one stretch
    for k, (value, a, b, c0, c1, angle) in enumerate(_SHEPP_ELLIPSES):
        if k < 2:
            a, b = a * head[0], b * head[1]
        else:
            value *= rng.uniform(0.7, 1.3)
            a, b = a * rng.uniform(0.85, 1.15), b * rng.uniform(0.85, 1.15)
            c0, c1 = c0 + rng.uniform(-0.04, 0.04), c1 + rng.uniform(-0.04, 0.04)
            angle += rng.uniform(-15, 15)
        u, v = _rotated(h0, h1, c0, c1, np.deg2rad(angle))
        img[(u / a) ** 2 + (v / b) ** 2 <= 1] += value
    img = np.clip(img, 0, None)
    peak = img.max()
    return (img / peak if peak > 0 else img).astype(np.float32)


#: scikit-image's bundled photographs (no download needed), for :func:`natural_crop`.
NATURAL_IMAGES = ("camera", "coins", "moon", "astronaut", "coffee", "chelsea", "rocket",
                  "brick", "grass", "gravel", "horse", "clock", "cell", "page", "text",
                  "immunohistochemistry", "retina", "hubble_deep_field")

def _sample_image(name: str) -> np.ndarray:
    from sklearn.datasets import load_sample_image

    return load_sample_image(f"{name}.jpg")


def _motorcycle(view: int) -> np.ndarray:
    import skimage.data

    return skimage.data.stereo_motorcycle()[view]


#: Loaders of the bundled photographs that :data:`NATURAL_IMAGES` does not hold:
#: scikit-learn's two sample images and the two views of scikit-image's stereo motorcycle.
_OTHER_LOADERS = {"china": lambda: _sample_image("china"),
                  "flower": lambda: _sample_image("flower"),
                  "motorcycle_left": lambda: _motorcycle(0),
                  "motorcycle_right": lambda: _motorcycle(1)}
#: Their names. The textured family of the tuning and validation splits
#: (``ctuq.data.splits``) crops them, so that no image a setting was chosen on is a
#: photograph the test split uses.
OTHER_PHOTOGRAPHS = tuple(_OTHER_LOADERS)


def _photograph(name: str) -> np.ndarray:
    """A bundled photograph as an RGB(A) or grey array, by name."""
    import skimage.data

    loader = _OTHER_LOADERS.get(name)
    return loader() if loader else getattr(skimage.data, name)()


@functools.lru_cache(maxsize=len(NATURAL_IMAGES) + len(OTHER_PHOTOGRAPHS))
def _natural_image(name: str) -> np.ndarray:
    from skimage.color import rgb2gray
    from skimage.util import img_as_float

    img = img_as_float(_photograph(name))
    if img.ndim == 3:
        img = rgb2gray(img[..., :3])
    return img.astype(np.float64)


def natural_crop(size: int = 128, seed: int = 0,
                 images: tuple[str, ...] = NATURAL_IMAGES) -> np.ndarray:
    """A random square crop of a bundled photograph, in grey levels.

    The seed chooses the photograph (one of ``images``), the crop side (30–80 %
    of the photograph's shorter side) and its position; the crop is resized
    to ``size`` (anti-aliased) and scaled to [0, 1] by its own minimum and
    maximum.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.
    seed : int, optional
        Seed of the choice. Default 0.
    images : tuple of str, optional
        The photographs to choose from, names of :data:`NATURAL_IMAGES` or
        :data:`OTHER_PHOTOGRAPHS`. Default :data:`NATURAL_IMAGES`.

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    from skimage.transform import resize

    size = _check_size(size)
    rng = np.random.default_rng(seed)
    img = _natural_image(images[int(rng.integers(len(images)))])
    side = int(rng.uniform(0.3, 0.8) * min(img.shape))
    r0 = int(rng.integers(0, img.shape[0] - side + 1))
    r1 = int(rng.integers(0, img.shape[1] - side + 1))
    crop = resize(img[r0:r0 + side, r1:r1 + side], (size, size), order=1, anti_aliasing=True)
    lo, hi = crop.min(), crop.max()
    crop = (crop - lo) / (hi - lo) if hi > lo else np.zeros_like(crop)
    return crop.astype(np.float32)


def digit(index: int, size: int = 28) -> np.ndarray:
    """The ``index``-th digit of :func:`digits`'s seed-0 order, alone.

    ``digit(i, size)`` equals ``digits(i + 1, size, seed=0)[i]`` without
    resizing the ``i`` digits before it.

    Returns
    -------
    ndarray of float32, shape (size, size)
    """
    size = _check_size(size)
    images, _ = _sklearn_digits()
    if not 0 <= index < len(images):
        raise InputError(f"must be in [0, {len(images)}), got {index!r}", field="index")
    return _framed_digit(images[np.random.default_rng(0).permutation(len(images))[index]], size)


# -- analytic rendering on any grid (for simulations on a finer grid) -----------------

#: The modified Shepp–Logan head (Toft's table) in its usual form: (value, semi-axis
#: along x, semi-axis along y, centre x, centre y, angle in degrees), with x the
#: column coordinate and y pointing up (against the row index), both on [-1, 1].
#: Rendered by :func:`shepp_logan_analytic`, it agrees with scikit-image's 400×400
#: raster of the same head (the source of :func:`shepp_logan`) on 99.5 % of the
#: pixels (the rest are edge pixels).
_SHEPP_TOFT = (
    (1.0, 0.69, 0.92, 0.0, 0.0, 0),
    (-0.8, 0.6624, 0.874, 0.0, -0.0184, 0),
    (-0.2, 0.11, 0.31, 0.22, 0.0, -18),
    (-0.2, 0.16, 0.41, -0.22, 0.0, 18),
    (0.1, 0.21, 0.25, 0.0, 0.35, 0),
    (0.1, 0.046, 0.046, 0.0, 0.1, 0),
    (0.1, 0.046, 0.046, 0.0, -0.1, 0),
    (0.1, 0.046, 0.023, -0.08, -0.605, 0),
    (0.1, 0.023, 0.023, 0.0, -0.606, 0),
    (0.1, 0.023, 0.046, 0.06, -0.605, 0),
)

#: Families drawn from shapes with exact edges (any grid renders them without
#: interpolation), and families drawn from a raster (rendering interpolates it).
ANALYTIC_PHANTOMS = ("shepp", "shepp-variant", "ellipses", "rectangles")
RASTER_PHANTOMS = ("digits", "natural")


def shepp_logan_analytic(size: int = 128) -> np.ndarray:
    """The modified Shepp–Logan head drawn from its ellipses at the pixel centres.

    Unlike :func:`shepp_logan` (a resized raster), the edges are exact at any
    ``size``, so a finer grid is a finer sampling of the same object.

    Parameters
    ----------
    size : int, optional
        Image side in pixels. Default 128.

    Returns
    -------
    ndarray of float32, shape (size, size)
        Values in [0, 1] (the skull is 1).

    Examples
    --------
    >>> float(shepp_logan_analytic(64).max())
    1.0
    """
    size = _check_size(size)
    rows, cols = _grid(size)
    x, y = cols, -rows
    img = np.zeros((size, size))
    for value, a, b, x0, y0, angle in _SHEPP_TOFT:
        phi = np.deg2rad(angle)
        u = (x - x0) * np.cos(phi) + (y - y0) * np.sin(phi)
        v = -(x - x0) * np.sin(phi) + (y - y0) * np.cos(phi)
        img[(u / a) ** 2 + (v / b) ** 2 <= 1] += value
    return np.clip(img, 0, 1).astype(np.float32)


def render_phantom(name: str, size: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """One phantom of :data:`PHANTOMS` drawn directly at ``size``, and how it was drawn.

    The same ``(name, seed)`` at two sizes is the same object sampled on two
    grids: the random draws of :func:`ellipses`, :func:`rectangles` and
    :func:`shepp_variant` do not depend on the size, and ``'shepp'`` is
    drawn from its ellipses (:func:`shepp_logan_analytic`). The families of
    :data:`RASTER_PHANTOMS` come from a raster resized to ``size`` (digits:
    bi-cubic from 8×8; natural crops: bi-linear from the photograph).

    Returns
    -------
    image : ndarray of float32, shape (size, size)
    how : {'analytic', 'raster'}
        ``'analytic'`` for :data:`ANALYTIC_PHANTOMS` (point samples of exact
        shapes), ``'raster'`` for :data:`RASTER_PHANTOMS` (interpolated).
    """
    if name == "shepp":
        return shepp_logan_analytic(size), "analytic"
    img = make_phantom(name, size, seed)
    return img, ("analytic" if name in ANALYTIC_PHANTOMS else "raster")
