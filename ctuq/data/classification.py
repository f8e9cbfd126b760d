"""Image-classification data sets for the classification benchmark.

The benchmark: docs/classification.md; its predictive maths: docs/method.md §8.3, §11.

Nothing is downloaded, ever:

- ``'digits'``: scikit-learn's bundled 8×8 handwritten digits
  (:func:`sklearn.datasets.load_digits`, 1797 images, 10 classes, pixel
  values 0–16 scaled to [0, 1]); a seeded, stratified train/test split.
- ``'mnist'``, ``'fmnist'`` (Fashion-MNIST), ``'kmnist'``: 28×28 images read
  from local files the user points to with ``data_dir``, in either format:

  * IDX (the original distribution, optionally gzip-compressed):
    ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each with or
    without ``.gz``), in ``data_dir`` or in ``data_dir/<name>``
    (``<name>`` one of ``mnist``, ``fmnist``, ``fashion-mnist``,
    ``fashion_mnist``, ``kmnist``, any case);
  * NPZ: ``<name>.npz`` with arrays ``x_train``, ``y_train``, ``x_test``,
    ``y_test`` (Keras' ``mnist.npz`` layout), or KMNIST's four files
    ``kmnist-{train,test}-{imgs,labels}.npz`` (array ``arr_0``).

  Without ``data_dir`` the files are looked for under
  :data:`SYSTEM_DATA_DIR` (``/usr/share/datasets``), where Debian's
  ``dataset-fashion-mnist`` package puts Fashion-MNIST
  (``fashion-mnist/*-idx?-ubyte.gz``; ``make install`` installs it when run
  as root). A missing or malformed file raises :class:`ctuq.errors.InputError` naming
  the file and what was expected.

Out-of-distribution (OOD) sets, all of the in-distribution images' shape:

- MNIST ↔ Fashion-MNIST (``ood_dir`` points to the other data set's files;
  KMNIST uses MNIST), the literature's standard pair;
- for digits (and whenever the other data set is not given), **permuted
  digits**: each test image with its pixels shuffled by a fixed random
  permutation per image (seeded). They keep every image's intensity
  histogram (so a detector cannot just threshold the brightness) but carry
  no stroke structure. This was chosen over held-out classes because it
  keeps the in-distribution task (all 10 digits) the same as the one that
  is scored for accuracy, NLL and ECE; held-out classes are available with
  ``ood='holdout'`` (classes ``holdout_classes`` are removed from training
  and testing and their test images form the OOD set; the remaining labels
  are renumbered ``0 … C−1``).

Rotation shift: :func:`rotate_images` turns images by an angle in degrees
(bilinear, zero padding, same size); :attr:`ClassificationData.rotated`
gives the rotated test set at 0–180°.

Examples
--------
>>> data = load_classification("digits", seed=0)
>>> tuple(data.x_train.shape[1:]), data.num_classes, data.ood_name
((1, 8, 8), 10, 'permuted digits')
"""

from __future__ import annotations

import gzip
import logging
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ctuq.errors import InputError

__all__ = ["ClassificationData", "load_classification", "load_digits_data", "read_idx",
           "load_mnist_like", "rotate_images", "permuted_images", "DATASETS",
           "DEFAULT_ANGLES", "SYSTEM_DATA_DIR"]

log = logging.getLogger(__name__)

#: Data sets known to :func:`load_classification`.
DATASETS = ("digits", "mnist", "fmnist", "kmnist")
#: Rotation angles (degrees) of the shift benchmark.
DEFAULT_ANGLES = (0, 30, 60, 90, 120, 150, 180)

#: Searched when no ``data_dir`` is given: Debian's data-set packages install here
#: (``dataset-fashion-mnist`` → ``/usr/share/datasets/fashion-mnist``).
SYSTEM_DATA_DIR = Path("/usr/share/datasets")

_DIRNAMES = {"mnist": ("mnist",), "fmnist": ("fmnist", "fashion-mnist", "fashion_mnist",
                                             "fashionmnist"),
             "kmnist": ("kmnist",)}
_IDX_FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
              "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
_KMNIST_NPZ = {"x_train": "kmnist-train-imgs.npz", "y_train": "kmnist-train-labels.npz",
               "x_test": "kmnist-test-imgs.npz", "y_test": "kmnist-test-labels.npz"}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
               0x0E: ">f8"}


@dataclass
class ClassificationData:
    """A classification benchmark data set (float32 images in [0, 1], int64 labels).

    Attributes
    ----------
    name : str
        ``'digits'``, ``'mnist'``, ``'fmnist'`` or ``'kmnist'``.
    x_train, x_test : Tensor, shape (N, 1, H, W)
    y_train, y_test : Tensor, shape (N,)
        Labels ``0 … C−1``.
    x_ood : Tensor, shape (M, 1, H, W)
        The out-of-distribution images.
    ood_name : str
        What ``x_ood`` is (``'permuted digits'``, ``'Fashion-MNIST'``, …).
    class_names : list of str
    seed : int
    info : dict
        Provenance: files read, split sizes, held-out classes.
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    x_ood: Tensor
    ood_name: str
    class_names: list[str]
    seed: int = 0
    info: dict = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(1, H, W)``."""
        return tuple(self.x_train.shape[1:])

    def rotated(self, angle_deg: float) -> Tensor:
        """The test images rotated by ``angle_deg`` degrees, ``[N, 1, H, W]``."""
        return rotate_images(self.x_test, angle_deg)

    def summary(self) -> dict:
        return {"name": self.name, "n_train": int(self.x_train.shape[0]),
                "n_test": int(self.x_test.shape[0]), "n_ood": int(self.x_ood.shape[0]),
                "image_shape": list(self.image_shape), "num_classes": self.num_classes,
                "ood": self.ood_name, "seed": self.seed, **self.info}


# ------------------------------------------------------------------------------
# readers


def read_idx(path) -> np.ndarray:
    """Read an IDX file (MNIST's format), plain or gzip-compressed.

    Parameters
    ----------
    path : str or Path

    Returns
    -------
    ndarray
        Of the shape and dtype stored in the header (``uint8`` ``[N, 28, 28]``
        for MNIST images, ``[N]`` for labels).

    Raises
    ------
    InputError
        Missing file, bad magic number, or fewer data bytes than the header says.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", file=path, field="idx")
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except OSError as err:
        raise InputError(f"cannot read ({err})", file=path, field="idx") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise InputError("not an IDX file (bad magic number)", file=path, field="magic")
    ndim = raw[3]
    if ndim < 1 or len(raw) < 4 + 4 * ndim:
        raise InputError(f"bad IDX header ({ndim} dimensions)", file=path, field="dims")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(dims))
    body = raw[4 + 4 * ndim:]
    if len(body) < count * dtype.itemsize:
        raise InputError(f"truncated: header says {dims}, file holds "
                         f"{len(body) // dtype.itemsize} values", file=path, field="data")
    return np.frombuffer(body, dtype=dtype, count=count).reshape(dims).astype(
        dtype.newbyteorder("="))


def _find(folder: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def _candidate_dirs(name: str, data_dir: Path) -> list[Path]:
    out = [data_dir]
    if data_dir.is_dir():
        subs = {p.name.lower(): p for p in data_dir.iterdir() if p.is_dir()}
        out += [subs[d] for d in _DIRNAMES[name] if d in subs]
    return out


def _npz_arrays(path: Path, keys) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise InputError(f"missing arrays {missing} (has {list(z.files)})", file=path,
                                 field=missing[0])
            return {k: np.asarray(z[k]) for k in keys}
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read as NPZ ({err})", file=path, field="npz") from None


def load_mnist_like(name: str, data_dir) -> dict:
    """Read MNIST / Fashion-MNIST / KMNIST from local IDX or NPZ files (no download).

    Parameters
    ----------
    name : {'mnist', 'fmnist', 'kmnist'}
    data_dir : str or Path or None
        The folder holding the files (or a sub-folder named after the data set).
        None: :data:`SYSTEM_DATA_DIR` when it has a sub-folder named after the
        data set.

    Returns
    -------
    dict
        ``x_train`` ``[N, 28, 28]`` uint8, ``y_train`` ``[N]``, ``x_test``,
        ``y_test``, and ``files`` (the paths read).

    Raises
    ------
    InputError
        When ``data_dir`` is not given or holds none of the accepted layouts
        (the message lists them), or a file is malformed.
    """
    if name not in _DIRNAMES:
        raise InputError(f"must be one of {sorted(_DIRNAMES)}, got {name!r}", field="dataset")
    if data_dir is None:
        system = SYSTEM_DATA_DIR
        if not any((system / d).is_dir() for d in _DIRNAMES[name]):
            hint = (" or, as root, `apt-get install dataset-fashion-mnist` (Debian) to put "
                    f"it in {system}" if name == "fmnist" else "")
            raise InputError(f"{name} is not bundled and is never downloaded: pass the folder "
                             f"with its IDX or NPZ files (--data-dir){hint}", field="data_dir")
        data_dir = system
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError("folder not found", file=data_dir, field="data_dir")
    for folder in _candidate_dirs(name, data_dir):
        found = {k: _find(folder, stem) for k, stem in _IDX_FILES.items()}
        if all(found.values()):
            out = {k: read_idx(p) for k, p in found.items()}
            out["files"] = [str(p) for p in found.values()]
            return out
        for npz in [folder / f"{alias}.npz" for alias in _DIRNAMES[name]]:
            if npz.is_file():
                out = _npz_arrays(npz, ("x_train", "y_train", "x_test", "y_test"))
                out["files"] = [str(npz)]
                return out
        if name == "kmnist" and all((folder / f).is_file() for f in _KMNIST_NPZ.values()):
            out = {k: _npz_arrays(folder / f, ("arr_0",))["arr_0"]
                   for k, f in _KMNIST_NPZ.items()}
            out["files"] = [str(folder / f) for f in _KMNIST_NPZ.values()]
            return out
    expected = (f"IDX files {', '.join(_IDX_FILES.values())} (optionally .gz), or "
                f"{_DIRNAMES[name][0]}.npz with x_train/y_train/x_test/y_test"
                + (", or kmnist-{train,test}-{imgs,labels}.npz" if name == "kmnist" else ""))
    raise InputError(f"no {name} files found; expected {expected}", file=data_dir,
                     field=name)


def _check_pair(x: np.ndarray, y: np.ndarray, what: str, files) -> None:
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise InputError(f"{what}: images {x.shape} and labels {y.shape} do not match "
                         "([N, H, W] and [N])", file=files[0] if files else None, field=what)


# ------------------------------------------------------------------------------
# transforms


def rotate_images(x: Tensor, angle_deg: float) -> Tensor:
    """Rotate images counter-clockwise by ``angle_deg`` degrees about their centre.

    Bilinear interpolation, zeros outside, same size (``torch``'s
    ``affine_grid`` / ``grid_sample`` with ``align_corners=False``).

    Parameters
    ----------
    x : Tensor, shape (N, C, H, W)
    angle_deg : float

    Returns
    -------
    Tensor, shape (N, C, H, W)
    """
    x = torch.as_tensor(x, dtype=torch.float32)
    if x.ndim != 4:
        raise InputError(f"expected images [N, C, H, W], got {tuple(x.shape)}", field="x")
    if float(angle_deg) % 360 == 0:
        return x.clone()
    t = np.deg2rad(float(angle_deg))
    c, s = float(np.cos(t)), float(np.sin(t))
    # grid_sample maps output coordinates to input coordinates: the inverse rotation
    theta = torch.tensor([[c, -s, 0.0], [s, c, 0.0]], dtype=torch.float32)
    grid = torch.nn.functional.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape),
                                           align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                                           align_corners=False)


def permuted_images(x: Tensor, seed: int = 0) -> Tensor:
    """Each image with its pixels shuffled by its own random permutation (seeded).

    Parameters
    ----------
    x : Tensor, shape (N, C, H, W)
    seed : int

    Returns
    -------
    Tensor, shape (N, C, H, W)
        Same per-image pixel histogram, no spatial structure.
    """
    gen = torch.Generator().manual_seed(int(seed))
    flat = x.reshape(x.shape[0], -1)
    idx = torch.argsort(torch.rand(flat.shape, generator=gen), dim=1)
    return torch.gather(flat, 1, idx).reshape(x.shape)


# ------------------------------------------------------------------------------
# the data sets


def _stratified_split(y: np.ndarray, test_fraction: float, seed: int):
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        n_test = int(round(test_fraction * idx.size))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    train, test = np.concatenate(train), np.concatenate(test)
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def _subsample(x, y, n, seed):
    if n is None or n >= x.shape[0]:
        return x, y
    rng = np.random.default_rng(seed)
    idx = rng.permutation(x.shape[0])[:int(n)]
    return x[idx], y[idx]


def _to_tensor(x: np.ndarray, scale: float) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32) / scale).unsqueeze(1)


def _holdout(x_tr, y_tr, x_te, y_te, classes, n_classes):
    keep = [c for c in range(n_classes) if c not in classes]
    remap = {c: i for i, c in enumerate(keep)}
    m_tr = np.isin(y_tr, keep)
    m_te = np.isin(y_te, keep)
    ood = x_te[~m_te]
    lab = np.vectorize(remap.get)
    return (x_tr[m_tr], lab(y_tr[m_tr]), x_te[m_te], lab(y_te[m_te]), ood, keep)


def load_digits_data(seed: int = 0, test_fraction: float = 0.3, ood: str = "permuted",
                     holdout_classes=(8, 9)) -> ClassificationData:
    """scikit-learn's bundled 8×8 digits, split (stratified, seeded) into train and test.

    Parameters
    ----------
    seed : int, optional
        Seed of the split and of the OOD permutations. Default 0.
    test_fraction : float, optional
        Default 0.3 (1257 training and 540 test images).
    ood : {'permuted', 'holdout'}, optional
        The OOD set (module docstring). Default ``'permuted'``.
    holdout_classes : sequence of int, optional
        With ``ood='holdout'``. Default ``(8, 9)``.

    Returns
    -------
    ClassificationData
    """
    from sklearn.datasets import load_digits

    if not 0 < test_fraction < 1:
        raise InputError(f"must be in (0, 1), got {test_fraction!r}", field="test_fraction")
    bunch = load_digits()
    x = bunch.images.astype(np.float32)
    y = bunch.target.astype(np.int64)
    tr, te = _stratified_split(y, test_fraction, seed)
    return _assemble("digits", x[tr], y[tr], x[te], y[te], 16.0, seed, ood, holdout_classes,
                     None, {"source": "sklearn.datasets.load_digits"})


def _assemble(name, x_tr, y_tr, x_te, y_te, scale, seed, ood, holdout_classes, ood_images,
              info) -> ClassificationData:
    n_classes = int(max(y_tr.max(), y_te.max())) + 1
    names = [str(c) for c in range(n_classes)]
    if ood == "holdout":
        classes = sorted({int(c) for c in holdout_classes})
        if not classes or any(c < 0 or c >= n_classes for c in classes) \
                or len(classes) >= n_classes - 1:
            raise InputError(f"need 1 to {n_classes - 2} classes in 0..{n_classes - 1}, got "
                             f"{list(holdout_classes)!r}", field="holdout_classes")
        x_tr, y_tr, x_te, y_te, ood_x, keep = _holdout(x_tr, y_tr, x_te, y_te, classes,
                                                       n_classes)
        names = [str(c) for c in keep]
        x_ood = _to_tensor(ood_x, scale)
        ood_name = f"held-out classes {classes}"
        info = {**info, "holdout_classes": classes}
    elif ood == "permuted":
        x_ood = None
        ood_name = f"permuted {'digits' if name == 'digits' else name}"
    elif ood == "dataset":
        if ood_images is None:
            raise InputError("no OOD data set given", field="ood_dir")
        x_ood, ood_name = ood_images
    else:
        raise InputError(f"must be 'permuted', 'holdout' or 'dataset', got {ood!r}",
                         field="ood")
    x_train, x_test = _to_tensor(x_tr, scale), _to_tensor(x_te, scale)
    if x_ood is None:
        x_ood = permuted_images(x_test, seed + 7919)
    return ClassificationData(name, x_train, torch.as_tensor(y_tr, dtype=torch.int64), x_test,
                              torch.as_tensor(y_te, dtype=torch.int64), x_ood, ood_name,
                              names, seed, info)


def load_classification(name: str = "digits", data_dir=None, *, seed: int = 0,
                        ood: str = "auto", ood_dir=None, n_train: int | None = None,
                        n_test: int | None = None, test_fraction: float = 0.3,
                        holdout_classes=(8, 9)) -> ClassificationData:
    """Load a benchmark data set (never downloads).

    Parameters
    ----------
    name : {'digits', 'mnist', 'fmnist', 'kmnist'}, optional
        Default ``'digits'``.
    data_dir : str or Path, optional
        Folder with the IDX / NPZ files (MNIST-like sets only). Default:
        :data:`SYSTEM_DATA_DIR` (Debian's ``dataset-fashion-mnist``).
    seed : int, optional
        Seed of splits, subsamples and OOD permutations. Default 0.
    ood : {'auto', 'permuted', 'holdout', 'dataset'}, optional
        ``'auto'``: the other data set when ``ood_dir`` is given (Fashion-MNIST
        for MNIST and KMNIST, MNIST for Fashion-MNIST), else permuted test
        images. Default ``'auto'``.
    ood_dir : str or Path, optional
        Folder with the OOD data set's files.
    n_train, n_test : int, optional
        Random subsets (seeded) of the training / test sets (MNIST-like sets
        have 60 000 / 10 000). Default: all.
    test_fraction : float, optional
        Digits only. Default 0.3.
    holdout_classes : sequence of int, optional
        With ``ood='holdout'``. Default ``(8, 9)``.

    Returns
    -------
    ClassificationData
    """
    name = str(name).lower()
    if name not in DATASETS:
        raise InputError(f"must be one of {', '.join(DATASETS)}, got {name!r}", field="dataset")
    if ood not in ("auto", "permuted", "holdout", "dataset"):
        raise InputError(f"must be 'auto', 'permuted', 'holdout' or 'dataset', got {ood!r}",
                         field="ood")
    if name == "digits":
        if ood == "dataset":
            raise InputError("digits has no OOD data set: use 'permuted' or 'holdout'",
                             field="ood")
        data = load_digits_data(seed, test_fraction, "permuted" if ood == "auto" else ood,
                                holdout_classes)
        if n_train is not None or n_test is not None:
            xtr, ytr = _subsample(data.x_train, data.y_train, n_train, seed)
            xte, yte = _subsample(data.x_test, data.y_test, n_test, seed + 1)
            data.x_train, data.y_train, data.x_test, data.y_test = xtr, ytr, xte, yte
            if data.ood_name.startswith("permuted"):
                data.x_ood = permuted_images(xte, seed + 7919)
        return data
    raw = load_mnist_like(name, data_dir)
    _check_pair(raw["x_train"], raw["y_train"], "train", raw["files"])
    _check_pair(raw["x_test"], raw["y_test"], "test", raw["files"])
    x_tr, y_tr = _subsample(raw["x_train"], raw["y_train"].astype(np.int64), n_train, seed)
    x_te, y_te = _subsample(raw["x_test"], raw["y_test"].astype(np.int64), n_test, seed + 1)
    ood_images = None
    if ood in ("auto", "dataset") and ood_dir is not None:
        other = "mnist" if name == "fmnist" else "fmnist"
        o = load_mnist_like(other, ood_dir)
        xo = o["x_test"] if n_test is None else _subsample(o["x_test"], o["y_test"], n_test,
                                                           seed + 2)[0]
        if xo.shape[1:] != x_te.shape[1:]:
            raise InputError(f"OOD images {xo.shape[1:]} differ from {x_te.shape[1:]}",
                             file=o["files"][0], field="ood_dir")
        ood_images = (_to_tensor(xo, 255.0), {"mnist": "MNIST", "fmnist": "Fashion-MNIST"}[other])
        ood = "dataset"
    elif ood == "auto":
        ood = "permuted"
    return _assemble(name, x_tr, y_tr, x_te, y_te, 255.0, seed, ood, holdout_classes,
                     ood_images, {"files": raw["files"]})
