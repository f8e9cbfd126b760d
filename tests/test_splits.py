"""The tuning / validation / test sets never share an image or a noise draw."""

import itertools

import numpy as np
import pytest

from ctuq.data import phantoms
from ctuq.data.splits import (DIGIT_RANGES, FAMILIES, FAMILY_ORDER, NOISE_BASE, PHOTOGRAPHS,
                               SEEDS_PER_SPLIT, SPLITS, Case, cases)
from ctuq.errors import InputError


def _all_cases(split, family):
    lo, hi = DIGIT_RANGES[split]
    n = hi - lo if family == "digits" else SEEDS_PER_SPLIT
    return cases(split, [family], n, size=8)


@pytest.mark.parametrize("family", ["ellipses", "shepp-variant", "rectangles", "digits"])
def test_splits_share_no_phantom_seed(family):
    # (photos: the splits also crop different photographs, test_photos_... below)
    seeds = {s: {c.phantom_seed for c in _all_cases(s, family)} for s in SPLITS}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not seeds[a] & seeds[b], (a, b)


def test_noise_seeds_are_unique_over_every_split_family_and_offset():
    seen = set()
    for split in SPLITS:
        for family in FAMILIES[split]:
            for c in _all_cases(split, family)[::997]:
                for off in (0, 99):
                    s = c.noise_seed(off)
                    assert s not in seen
                    seen.add(s)
    # the boundaries of the index ranges too
    edge = [Case(s, "ellipses", i, 8).noise_seed(o) for s in SPLITS
            for i in (0, SEEDS_PER_SPLIT - 1) for o in (0, 99)]
    assert len(set(edge)) == len(edge)


def test_natural_images_only_in_the_test_split():
    assert "natural" in FAMILIES["test"]
    for split in ("tuning", "validation"):
        with pytest.raises(InputError, match="family"):
            Case(split, "natural", 0, 16)


def test_a_case_is_reproducible_and_cases_differ():
    a, b = Case("validation", "shepp-variant", 3, 32), Case("validation", "shepp-variant", 4, 32)
    np.testing.assert_array_equal(a.image(), Case("validation", "shepp-variant", 3, 32).image())
    assert not np.array_equal(a.image(), b.image())
    d = Case("test", "digits", 5, 28)
    np.testing.assert_array_equal(d.image(), phantoms.digits(1206, 28, seed=0)[1205])


@pytest.mark.parametrize("bad", [dict(split="train"), dict(index=-1), dict(index=1.5),
                                 dict(family="digits", index=600)])
def test_bad_cases_are_refused(bad):
    args = {"split": "tuning", "family": "ellipses", "index": 0, "size": 16, **bad}
    with pytest.raises(InputError):
        Case(**args)


def test_noise_offset_is_checked():
    with pytest.raises(InputError, match="offset"):
        Case("test", "ellipses", 0, 16).noise_seed(100)


def test_photos_crop_photographs_no_other_split_uses():
    tuning, validation = set(PHOTOGRAPHS["tuning"]), set(PHOTOGRAPHS["validation"])
    assert tuning and validation and not tuning & validation
    assert not (tuning | validation) & set(phantoms.NATURAL_IMAGES)
    assert "photos" not in FAMILIES["test"]
    with pytest.raises(InputError, match="family"):
        Case("test", "photos", 0, 16)
    # every crop of a split comes from that split's photographs: a crop of the other
    # split's photograph under the same seed is a different image
    for split, other in (("tuning", "validation"), ("validation", "tuning")):
        for index in range(3):
            c = Case(split, "photos", index, 24)
            img = c.image()
            assert img.shape == (24, 24) and img.dtype == np.float32
            assert img.min() == 0.0 and img.max() == 1.0 and img.std() > 0.05
            np.testing.assert_array_equal(img, phantoms.natural_crop(
                24, c.phantom_seed, PHOTOGRAPHS[split]))
            assert not np.array_equal(img, phantoms.natural_crop(
                24, c.phantom_seed, PHOTOGRAPHS[other]))
    fine, how = Case("tuning", "photos", 1, 12).fine_image(2)
    assert how == "raster"
    np.testing.assert_array_equal(fine, Case("tuning", "photos", 1, 24).image())


def test_a_new_family_leaves_the_existing_noise_draws_alone():
    # the noise seed formula numbers families in FAMILY_ORDER: the families of the test
    # split keep the numbers they had before photos were added
    assert FAMILY_ORDER[:len(FAMILIES["test"])] == FAMILIES["test"]
    assert Case("test", "natural", 7, 16).noise_seed(3) == (
        NOISE_BASE["test"] + 100 * (4 * SEEDS_PER_SPLIT + 7) + 3)
    assert Case("tuning", "photos", 7, 16).noise_seed(3) == (
        NOISE_BASE["tuning"] + 100 * (5 * SEEDS_PER_SPLIT + 7) + 3)
