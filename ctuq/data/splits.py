"""Disjoint tuning, validation and test sets of benchmark images and noise draws.

A number measured on the images that chose a setting says nothing about
images the setting has not seen. Every benchmark, calibration and tuning
script therefore takes its images from one named split (see
``docs/data_splits.md``):

- **tuning** — presets, learning rates, step sizes, and the coefficients that
  ``ctuq calibrate`` ships. Phantom and noise seeds ``0 … 9,999`` (every
  script before this module used seeds in this range), the standard
  Shepp–Logan head, digits 0–599 of :func:`ctuq.data.phantoms.digit`
  (the scripts' ``digits(n, seed=0)`` are digits 0 … n−1).
- **validation** — choosing defaults (prior, TV-PredCP on or off, the
  model-error method). Seeds ``10,000 … 19,999``, digits 600–1,199.
- **test** — every figure the README reports. Seeds ``20,000 … 29,999``,
  digits 1,200–1,796, and the natural-image crops, which no other split uses.

Tuning and validation have a textured family instead, ``photos``: crops of
bundled photographs the test split does not use, a different pair for each
split (:data:`PHOTOGRAPHS`).

A :class:`Case` names one image of a split; its noise seed is derived from
the same index, so two scripts that ask for the same case see the same
image and, for the same noise level, the same noise draw.

Examples
--------
>>> from ctuq.data.splits import cases
>>> [c.name for c in cases("validation", ["ellipses", "digits"], 2, size=32)]
['validation/ellipses/0', 'validation/ellipses/1', 'validation/digits/0', 'validation/digits/1']
>>> cases("test", ["natural"], 1, size=32)[0].image().shape
(32, 32)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctuq.data import phantoms
from ctuq.errors import InputError

SPLITS = ("tuning", "validation", "test")

#: First phantom seed of each split; a split owns ``SEEDS_PER_SPLIT`` seeds.
SEED_BASE = {"tuning": 0, "validation": 10_000, "test": 20_000}
SEEDS_PER_SPLIT = 10_000
#: First noise seed of each split (far from every phantom seed and from the
#: noise seeds < 10,000 of the scripts written before this module).
NOISE_BASE = {"tuning": 10_000_000, "validation": 20_000_000, "test": 30_000_000}

#: Families each split may draw from. Natural-image crops are kept for testing; the
#: textured family of tuning and validation, ``photos``, crops other photographs.
FAMILIES = {
    "tuning": ("ellipses", "shepp-variant", "rectangles", "digits", "photos"),
    "validation": ("ellipses", "shepp-variant", "rectangles", "digits", "photos"),
    "test": ("ellipses", "shepp-variant", "rectangles", "digits", "natural"),
}
#: Every family in the order that numbers them in the noise seeds (new ones go last,
#: so that an existing case keeps its noise draw).
FAMILY_ORDER = ("ellipses", "shepp-variant", "rectangles", "digits", "natural", "photos")
#: The photographs each split's ``photos`` crops come from
#: (:data:`ctuq.data.phantoms.OTHER_PHOTOGRAPHS`): disjoint between the splits and from
#: the test split's natural crops.
PHOTOGRAPHS = {"tuning": ("china", "motorcycle_left"),
               "validation": ("flower", "motorcycle_right")}

#: Indices into :func:`ctuq.data.phantoms.digit`'s order (1,797 digits).
DIGIT_RANGES = {"tuning": (0, 600), "validation": (600, 1200), "test": (1200, 1797)}


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}",
                         field="split")
    return split


@dataclass(frozen=True)
class Case:
    """One benchmark image: a split, a family, an index within both, a size.

    Parameters
    ----------
    split : {'tuning', 'validation', 'test'}
    family : str
        One of ``FAMILIES[split]``.
    index : int
        ``0 <= index`` below the split's capacity (``SEEDS_PER_SPLIT``, or
        the split's digit count).
    size : int
        Image side in pixels.
    """

    split: str
    family: str
    index: int
    size: int

    def __post_init__(self):
        _check_split(self.split)
        if self.family not in FAMILIES[self.split]:
            raise InputError(f"family {self.family!r} is not in the {self.split} split; "
                             f"choose one of {', '.join(FAMILIES[self.split])}", field="family")
        lo, hi = DIGIT_RANGES[self.split]
        cap = hi - lo if self.family == "digits" else SEEDS_PER_SPLIT
        if not (isinstance(self.index, (int, np.integer)) and 0 <= self.index < cap):
            raise InputError(f"must be an integer in [0, {cap}), got {self.index!r}",
                             field="index")

    @property
    def name(self) -> str:
        return f"{self.split}/{self.family}/{self.index}"

    @property
    def phantom_seed(self) -> int:
        """The seed given to the phantom generator (digits: the digit's index)."""
        if self.family == "digits":
            return DIGIT_RANGES[self.split][0] + int(self.index)
        return SEED_BASE[self.split] + int(self.index)

    def noise_seed(self, offset: int = 0) -> int:
        """The noise seed of this case; ``offset`` in ``[0, 100)`` tells repeated draws apart.

        Noise seeds live apart from phantom seeds: ``NOISE_BASE[split] +
        100 · (family number · SEEDS_PER_SPLIT + index) + offset``.
        """
        if not (isinstance(offset, (int, np.integer)) and 0 <= offset < 100):
            raise InputError(f"must be an integer in [0, 100), got {offset!r}", field="offset")
        family = FAMILY_ORDER.index(self.family)
        return NOISE_BASE[self.split] + 100 * (family * SEEDS_PER_SPLIT + int(self.index)) + offset

    def image(self) -> np.ndarray:
        """The phantom, float32 in [0, 1], shape ``(size, size)``."""
        if self.family == "digits":
            return phantoms.digit(self.phantom_seed, self.size)
        if self.family == "photos":
            return phantoms.natural_crop(self.size, self.phantom_seed, PHOTOGRAPHS[self.split])
        return phantoms.make_phantom(self.family, self.size, self.phantom_seed)

    def fine_image(self, upsample: int = 4) -> tuple[np.ndarray, str]:
        """The same phantom drawn on a grid ``upsample`` times finer, and how.

        Analytic families (ellipses, shepp-variant, rectangles) are drawn
        from their exact shapes at the finer pixels; digits and photograph crops
        are interpolated from their source raster (see
        :func:`ctuq.data.phantoms.render_phantom`).

        Returns
        -------
        image : ndarray of float32, shape (upsample·size, upsample·size)
        how : {'analytic', 'raster'}
        """
        if isinstance(upsample, bool) or not isinstance(upsample, (int, np.integer)) \
                or upsample < 1:
            raise InputError(f"must be an integer >= 1, got {upsample!r}", field="upsample")
        n = int(upsample) * self.size
        if self.family in ("digits", "photos"):
            return Case(self.split, self.family, self.index, n).image(), "raster"
        return phantoms.render_phantom(self.family, n, self.phantom_seed)


def cases(split: str, families=None, n_per_family: int = 1, *, size: int,
          start: int = 0) -> list[Case]:
    """``n_per_family`` consecutive cases of every family, family by family.

    Parameters
    ----------
    split : {'tuning', 'validation', 'test'}
    families : sequence of str, optional
        Default: every family of the split.
    n_per_family : int
        Cases per family. Default 1.
    size : int
        Image side in pixels.
    start : int
        First index. Default 0.

    Returns
    -------
    list of Case
    """
    families = FAMILIES[_check_split(split)] if families is None else tuple(families)
    return [Case(split, f, start + i, size) for f in families for i in range(n_per_family)]
