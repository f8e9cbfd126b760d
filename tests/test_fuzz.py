"""The robustness fuzz suite (issue 25 item 7).

Malformed sinogram files (hypothesis-generated), seeded byte-level corruption
of a valid ``ctuq simulate`` file and of a valid result file, and bad TOML
settings go through the entry points a user has: ``ctuq info``, the napari
reader, ``ctuq reconstruct`` (the batch runner) and, for a sample, the real
``ctuq`` process. Every case must end as a success or one clear error; never
an internal error (a traceback), a crash, a hang, a modified input or a lost
output. The default suite runs a bounded sample (about a minute); the
``slow`` tests run every 16-byte offset and hundreds of generated files.

``CTUQ_FUZZ_SLOW=1 pytest -m slow tests/test_fuzz.py`` runs the long version;
``CTUQ_FUZZ_REPORT=path.json`` writes the counts per category
(``docs/robustness.md`` quotes a slow run).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctuq.errors import InputError

pytestmark = pytest.mark.usefixtures("one_thread")

#: Seconds a reader may take before it counts as hung (the isolated read's limit).
READ_LIMIT = 20.0
#: Seconds a whole case may take (a batch case includes a tiny reconstruction).
CASE_LIMIT = 120.0
OUTCOMES = ("ok", "clear_error", "traceback", "crash", "hang", "input_modified", "output_lost")
COUNTS: dict[str, Counter] = defaultdict(Counter)
CRASHES_CONTAINED: Counter = Counter()
TINY = {"preset": "reference-28", "threads": 1, "dip": {"iterations": 5},
        "read": {"read_timeout": READ_LIMIT},
        "uncertainty": {"em_steps": 1, "n_samples": 2, "predictive_samples": 2,
                        "stored_samples": 0, "predcp": False, "preconditioner_rank": 4,
                        "cg_max_iter": 10}}
#: The long runs (an hour on a 2-core machine) only on request.
LONG = pytest.mark.skipif(not os.environ.get("CTUQ_FUZZ_SLOW"),
                          reason="long fuzz run: CTUQ_FUZZ_SLOW=1 pytest -m slow tests/test_fuzz.py")
HYP = dict(deadline=None, derandomize=True, database=None,
           suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                  HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("CTUQ_FUZZ_REPORT")
    if path:
        doc = {"categories": {k: dict(v) for k, v in COUNTS.items()},
               "reader_crashes_contained": dict(CRASHES_CONTAINED)}
        Path(path).write_text(json.dumps(doc, indent=1))


def _sha(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def _record(category: str, outcome: str, detail: str = "") -> None:
    COUNTS[category][outcome] += 1
    COUNTS[category]["inputs"] += 1
    if "crashed the reader" in detail:
        CRASHES_CONTAINED["crash"] += 1
    if "longer than" in detail:
        CRASHES_CONTAINED["hang"] += 1
    assert outcome in ("ok", "clear_error"), f"{category}: {outcome}: {detail}"


def _names(text: str, path: Path) -> bool:
    """The message names the file or its sidecar geometry ``<stem>.json`` (the console
    may have wrapped it)."""
    flat = "".join(text.split())
    return any("".join(name.split()) in flat for name in (
        path.name, path.with_suffix(".json").name, path.name + ".json"))


# -- entry points ------------------------------------------------------------------------
def run_info(path: Path, category: str, extra=()) -> str:
    """``ctuq info`` in this process (the file itself is read in a child)."""
    from ctuq.app.cli import main

    before = _sha(path)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["info", str(path), "--read-timeout", str(READ_LIMIT), *extra])
    took = time.monotonic() - t0
    text = err.getvalue()
    if took > READ_LIMIT + 30:
        outcome = "hang"
    elif _sha(path) != before:
        outcome = "input_modified"
    elif rc == 0:
        outcome = "ok"
    elif rc == 2 and text.startswith("error:") and "internal error" not in text \
            and "Traceback" not in text and _names(text, path):
        outcome = "clear_error"
    else:
        outcome = "traceback"
    _record(category, outcome, text)
    return outcome


def run_napari_reader(path: Path, category: str) -> str:
    """The napari reader contribution, without a viewer (notifications recorded)."""
    from napari.utils.notifications import notification_manager

    from ctuq.app import _reader

    _reader.READ_TIMEOUT = READ_LIMIT     # the viewer's limit (60 s by default)
    reader_function = _reader.reader_function
    before = _sha(path)
    n0 = len(notification_manager.records)
    t0 = time.monotonic()
    try:
        layers = reader_function(str(path))
    except Exception as exc:  # noqa: BLE001 - counted, then the assertion fails
        _record(category, "traceback", repr(exc))
        return "traceback"
    took = time.monotonic() - t0
    new = notification_manager.records[n0:]
    errors = [n.message for n in new if str(n.severity) in ("error", "ERROR")
              or getattr(n.severity, "value", "") == "error"]
    if took > READ_LIMIT + 30:
        outcome = "hang"
    elif _sha(path) != before:
        outcome = "input_modified"
    elif layers and layers[0][0] is not None:
        outcome = "ok"
    elif len(errors) == 1 and errors[0].startswith("ctuq cannot open this file:") \
            and _names(errors[0], path):
        outcome = "clear_error"
    else:
        outcome = "traceback"
    _record(category, outcome, " | ".join(errors))
    return outcome


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    """An output folder holding a finished result and a user's file, both to be kept."""
    from ctuq.data.io import Result, write_result

    d = tmp_path_factory.mktemp("fuzz_out")
    write_result(d / "keep.ctuq.h5", Result(np.ones((4, 4)), np.ones((4, 4))))
    (d / ".notes.tmp").write_text("user notes")
    return d


def run_batch_case(path: Path, category: str, out_dir: Path) -> str:
    from ctuq.app.batch import run_batch

    before = _sha(path)
    keep = {name: _sha(out_dir / name) for name in ("keep.ctuq.h5", ".notes.tmp")}
    t0 = time.monotonic()
    try:
        res = run_batch([path], out_dir, TINY, overwrite=True)[0]
    except InputError as exc:
        outcome, detail = "clear_error", str(exc)
        res = None
    except Exception as exc:  # noqa: BLE001
        outcome, detail = "traceback", repr(exc)
        res = None
    else:
        detail = res.error or ""
        outcome = "ok" if res.status == "done" else (
            "clear_error" if res.error and "internal error" not in res.error else "traceback")
    took = time.monotonic() - t0
    if took > CASE_LIMIT:
        outcome = "hang"
    if _sha(path) != before:
        outcome = "input_modified"
    if any(_sha(out_dir / name) != digest for name, digest in keep.items()):
        outcome = "output_lost"
    if res is not None and res.status == "done":
        (out_dir / Path(res.output).name).unlink()
    _record(category, outcome, detail)
    return outcome


def run_cli_process(path: Path, category: str) -> str:
    """The real ``ctuq info`` process: its exit status shows any crash of ctuq itself."""
    before = _sha(path)
    try:
        p = subprocess.run([sys.executable, "-m", "ctuq.app.cli", "info", str(path),
                            "--read-timeout", str(READ_LIMIT)], capture_output=True, text=True,
                           timeout=READ_LIMIT + 60)
    except subprocess.TimeoutExpired:
        _record(category, "hang")
        return "hang"
    if p.returncode < 0:
        outcome = "crash"
    elif _sha(path) != before:
        outcome = "input_modified"
    elif p.returncode == 0:
        outcome = "ok"
    elif p.returncode == 2 and p.stderr.startswith("error:") and "Traceback" not in p.stderr \
            and "internal error" not in p.stderr:
        outcome = "clear_error"
    else:
        outcome = "traceback"
    _record(category, outcome, p.stderr)
    return outcome


# -- malformed files (hypothesis) -------------------------------------------------------------
def _valid_arrays(rng, n_angles=6, n_det=9):
    return rng.uniform(0.1, 2.0, (n_angles, n_det)).astype(np.float32)


def make_file(folder: Path, spec: dict) -> Path:
    """A sinogram file of ``spec['format']`` broken as ``spec`` says."""
    rng = np.random.default_rng(spec["seed"])
    fmt, sino = spec["format"], _valid_arrays(rng)
    angles = np.arange(sino.shape[0]) * 30.0
    suffix = {"nxtomo": ".nxs", "npy": ".npy", "npz": ".npz", "tiff": ".tif"}.get(fmt, ".h5")
    path = folder / f"case{spec['seed']}{suffix}"
    if spec["values"] == "nan":
        sino[rng.integers(0, sino.shape[0]), 0] = np.nan
    elif spec["values"] == "int":
        sino = (sino * 100).astype(np.int16)
    elif spec["values"] == "1d":
        sino = sino.reshape(-1)
    elif spec["values"] == "4d":
        sino = sino.reshape(1, 1, *sino.shape)
    elif spec["values"] == "negative_raw":
        sino = -sino
    if fmt in ("nxtomo", "nxtomo_sim"):
        if fmt == "nxtomo_sim":
            from ctuq.data.geometry import Geometry
            from ctuq.data.io import Sinogram, write_sinogram

            g = Geometry.parallel(8, 6)
            write_sinogram(path, Sinogram(rng.uniform(0, 1, g.range_shape), g,
                                          {"noise_std": 0.1}, ground_truth=np.ones((8, 8))))
        else:
            with h5py.File(path, "w") as h:
                h["entry/instrument/detector/data"] = sino
                if spec["values"] == "negative_raw":
                    h["entry/instrument/detector/data"].attrs["quantity"] = "intensity"
                h["entry/sample/rotation_angle"] = angles[:sino.shape[0] if sino.ndim > 1
                                                          else 6]
                if spec["angle_units"]:
                    h["entry/sample/rotation_angle"].attrs["units"] = spec["angle_units"]
    elif fmt == "dxchange":
        with h5py.File(path, "w") as h:
            h["exchange/data"] = sino[:, None, :] if sino.ndim == 2 else sino
            h["exchange/theta"] = angles
            if spec["angle_units"]:
                h["exchange/theta"].attrs["units"] = spec["angle_units"]
    elif fmt == "hdf5":
        with h5py.File(path, "w") as h:
            ds = h.create_dataset("sino", data=sino)
            ds.attrs["angles_deg"] = angles
    elif fmt == "npy":
        np.save(path, sino)
    elif fmt == "npz":
        np.savez(path, sinogram=sino, angles_deg=angles)
    elif fmt == "tiff":
        import tifffile

        tifffile.imwrite(path, sino)
    else:  # garbage
        path.write_bytes(rng.bytes(spec["size"]))
        return path
    blob = bytearray(path.read_bytes())
    if spec["cut"] is not None:
        blob = blob[: int(len(blob) * spec["cut"])]
    for _ in range(spec["flips"]):
        if blob:
            blob[int(rng.integers(len(blob)))] = int(rng.integers(256))
    path.write_bytes(bytes(blob))
    return path


FILE_SPECS = st.fixed_dictionaries({
    "seed": st.integers(0, 10**6),
    "format": st.sampled_from(["nxtomo", "nxtomo_sim", "dxchange", "hdf5", "npy", "npz",
                               "tiff", "garbage"]),
    "values": st.sampled_from(["ok", "ok", "nan", "int", "1d", "4d", "negative_raw"]),
    "angle_units": st.sampled_from([None, "degree", "rad", "furlong"]),
    "cut": st.one_of(st.none(), st.floats(0.0, 0.999)),
    "flips": st.sampled_from([0, 0, 1, 8, 64]),
    "size": st.integers(0, 4096),
})


def _malformed(tmp_path_factory, out_dir, spec, batch: bool):
    folder = tmp_path_factory.mktemp("malformed")
    path = make_file(folder, spec)
    run_info(path, "malformed sinogram files: ctuq info")
    run_napari_reader(path, "malformed sinogram files: napari reader")
    if batch:
        run_batch_case(path, "malformed sinogram files: ctuq reconstruct", out_dir)


@settings(max_examples=10, **HYP)
@given(spec=FILE_SPECS)
def test_malformed_files(tmp_path_factory, out_dir, spec):
    _malformed(tmp_path_factory, out_dir, spec, batch=spec["seed"] % 4 == 0)


@pytest.mark.slow
@LONG
@settings(max_examples=300, **HYP)
@given(spec=FILE_SPECS)
def test_malformed_files_slow(tmp_path_factory, out_dir, spec):
    _malformed(tmp_path_factory, out_dir, spec, batch=spec["seed"] % 4 == 0)


# -- byte-level corruption of valid files -------------------------------------------------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """``ctuq simulate --size 16 --angles 10`` (the issue's file)."""
    from ctuq.app.cli import main

    d = tmp_path_factory.mktemp("sim")
    assert main(["simulate", str(d / "s.h5"), "--size", "16", "--angles", "10"]) == 0
    return (d / "s.h5").read_bytes()


@pytest.fixture(scope="module")
def result_bytes(tmp_path_factory):
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Result, write_result

    d = tmp_path_factory.mktemp("res")
    rng = np.random.default_rng(0)
    write_result(d / "r.h5", Result(rng.random((8, 8)), rng.random((8, 8)),
                                    samples=rng.random((2, 8, 8)),
                                    geometry=Geometry.parallel(8, 6), metrics={"psnr": 20.0},
                                    config={"seed": 0}, em_trace=[{"step": 0, "s": 1.0}]))
    return (d / "r.h5").read_bytes()


def _zeroed(folder: Path, blob: bytes, offset: int, name: str) -> Path:
    b = bytearray(blob)
    b[offset:offset + 8] = b"\0" * len(b[offset:offset + 8])
    path = folder / f"{name}_{offset}.h5"
    path.write_bytes(bytes(b))
    return path


def _byte_cases(tmp_path_factory, out_dir, blob, offsets, name, every_napari, every_batch,
                every_process):
    folder = tmp_path_factory.mktemp(name)
    for i, off in enumerate(offsets):
        path = _zeroed(folder, blob, off, name)
        run_info(path, f"{name}: 8 zero bytes, ctuq info")
        if every_napari and i % every_napari == 0:
            run_napari_reader(path, f"{name}: 8 zero bytes, napari reader")
        if every_batch and i % every_batch == 0:
            run_batch_case(path, f"{name}: 8 zero bytes, ctuq reconstruct", out_dir)
        if every_process and i % every_process == 0:
            run_cli_process(path, f"{name}: 8 zero bytes, ctuq process")
        path.unlink()


def test_byte_corruption_sample(tmp_path_factory, out_dir, simulated, result_bytes):
    rng = np.random.default_rng(2025)
    offs = sorted(rng.choice(np.arange(0, len(simulated), 16), 12, replace=False))
    _byte_cases(tmp_path_factory, out_dir, simulated, offs, "simulated sinogram", 4, 6, 6)
    offs = sorted(rng.choice(np.arange(0, len(result_bytes), 16), 6, replace=False))
    _byte_cases(tmp_path_factory, out_dir, result_bytes, offs, "result file", 3, 0, 0)


@pytest.mark.slow
@LONG
def test_byte_corruption_every_offset(tmp_path_factory, out_dir, simulated, result_bytes):
    _byte_cases(tmp_path_factory, out_dir, simulated, range(0, len(simulated), 16),
                "simulated sinogram", 4, 40, 50)
    _byte_cases(tmp_path_factory, out_dir, result_bytes, range(0, len(result_bytes), 64),
                "result file", 4, 0, 0)


# -- settings ---------------------------------------------------------------------------------------
_KEYS = ["preset", "device", "seed", "backend", "noise_std", "threads", "dip.iterations",
         "dip.lr", "dip.warmup", "dip.lr_min_factor", "dip.tv_weight", "dip.dropout",
         "uncertainty.n_samples", "uncertainty.predcp", "uncertainty.learn_noise",
         "uncertainty.predictive_samples", "uncertainty.prior", "geometry.pixel_size",
         "geometry.angles", "geometry.angle_unit", "geometry.center_offset",
         "read.raw", "read.convention", "read.max_memory_gib", "nosuch", "dip.nosuch"]
_VALUES = ['1', '0', '-5', '1e300', 'nan', 'inf', '-inf', 'true', 'false', '"10"', '""',
           '"auto"', '"cpu"', '"tpu"', '"no"', '[1, 2]', '[]', '{a = 1}', '1.5', '"[/x]"',
           '":x:"', '1000000000', '2025-01-01']
TOML_DOCS = st.one_of(
    st.lists(st.tuples(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), min_size=1,
             max_size=4),
    st.binary(max_size=200).map(lambda b: ("raw", b)),
    st.text(max_size=200).map(lambda t: ("utf16", t)))


def _toml_file(folder: Path, doc) -> Path:
    path = folder / "settings.toml"
    if isinstance(doc, tuple) and doc[0] == "raw":
        path.write_bytes(doc[1])
    elif isinstance(doc, tuple) and doc[0] == "utf16":
        path.write_bytes(doc[1].encode("utf-16"))
    else:
        top, tables = [], defaultdict(list)
        for key, value in doc:
            if "." in key:
                t, k = key.split(".")
                tables[t].append(f"{k} = {value}")
            else:
                top.append(f"{key} = {value}")
        text = "\n".join(top) + "\n" + "".join(
            f"[{t}]\n" + "\n".join(lines) + "\n" for t, lines in tables.items())
        path.write_text(text)
    return path


def _settings_case(tmp_path_factory, doc):
    from ctuq.recon.config import ReconstructionConfig

    path = _toml_file(tmp_path_factory.mktemp("toml"), doc)
    try:
        ReconstructionConfig.from_toml(path)
        outcome, detail = "ok", ""
    except InputError as err:
        outcome = "clear_error" if err.file == str(path) and err.field else "traceback"
        detail = str(err)
    except Exception as exc:  # noqa: BLE001
        outcome, detail = "traceback", repr(exc)
    _record("bad TOML settings", outcome, detail)


@settings(max_examples=25, **HYP)
@given(doc=TOML_DOCS)
def test_bad_settings(tmp_path_factory, doc):
    _settings_case(tmp_path_factory, doc)


@pytest.mark.slow
@LONG
@settings(max_examples=300, **HYP)
@given(doc=TOML_DOCS)
def test_bad_settings_slow(tmp_path_factory, doc):
    _settings_case(tmp_path_factory, doc)



# == the hostile tester's categories ============================================================
# Seeded generators of inputs; every input goes through the library reader in this process
# (milliseconds), a sample through ctuq info (its own reading child, about a second each),
# the napari reader, the batch and the real process. The slow run sends every input
# through every entry point.
def run_api(path: Path, category: str, **options) -> str:
    """``ctuq.data.io.read_sinogram`` in this process: a Sinogram or an InputError naming
    the file; the input's bytes unchanged."""
    from ctuq.data.io import read_sinogram

    before = _sha(path)
    t0 = time.monotonic()
    try:
        read_sinogram(path, **options)
        outcome, detail = "ok", ""
    except InputError as err:
        outcome = "clear_error" if err.file and _names(err.file, path) else "traceback"
        detail = str(err)
    except Exception as exc:  # noqa: BLE001 - counted, then the assertion fails
        outcome, detail = "traceback", repr(exc)
    if time.monotonic() - t0 > READ_LIMIT:
        outcome = "hang"
    if _sha(path) != before:
        outcome = "input_modified"
    _record(category, outcome, detail)
    return outcome


def _entry_points(tmp_path_factory, out_dir, cases, category, *, info_every, napari_every,
                  batch_every=0, info_args=()):
    """Each ``(path, options)`` of ``cases`` through the library reader; every
    ``info_every``-th through ``ctuq info``, and so on (0: never)."""
    for i, (path, options) in enumerate(cases):
        run_api(path, f"{category}: read_sinogram", **options)
        if info_every and i % info_every == 0:
            run_info(path, f"{category}: ctuq info", extra=info_args)
        if napari_every and i % napari_every == 0 and not options:
            run_napari_reader(path, f"{category}: napari reader")
        if batch_every and i % batch_every == 0 and not options:
            run_batch_case(path, f"{category}: ctuq reconstruct", out_dir)


NA_F, ND_F, ROWS_F = 6, 9, 2


def _raw_frames(rng, rows):
    darks = rng.uniform(90, 110, (2, rows, ND_F))
    flats = rng.uniform(900, 1100, (2, rows, ND_F))
    proj = (flats.mean(0) - darks.mean(0)) * np.exp(-rng.uniform(0.1, 2, (NA_F, rows, ND_F))) \
        + darks.mean(0)
    return darks, flats, proj


def make_flats_equal_darks(folder: Path, i: int):
    """NXtomo and DXchange (the formats that carry flat and dark frames) with flats
    equal to darks: everywhere, at some pixels, or in one frame pair."""
    rng = np.random.default_rng(1000 + i)
    fmt = ("nxtomo", "dxchange")[i % 2]
    how = ("all", "pixels", "one pair", "mean")[(i // 2) % 4]
    rows = (1, ROWS_F)[(i // 8) % 2]
    darks, flats, proj = _raw_frames(rng, rows)
    if how == "all":
        flats = darks.copy()
    elif how == "pixels":
        m = rng.random(darks.shape[1:]) < 0.2
        m.flat[int(rng.integers(m.size))] = True
        flats[:, m] = darks[:, m]
    elif how == "one pair":
        flats[0] = darks[0]
    else:                              # the frames differ but their means are equal
        flats = darks[::-1].copy()
    path = folder / f"fd{i}{'.nxs' if fmt == 'nxtomo' else '.h5'}"
    with h5py.File(path, "w") as h:
        if fmt == "nxtomo":
            h["entry/instrument/detector/data"] = np.concatenate([darks, flats, proj])
            h["entry/instrument/detector/image_key"] = np.array([2, 2, 1, 1] + [0] * NA_F,
                                                                np.int8)
            h["entry/sample/rotation_angle"] = np.r_[[0.0] * 4, np.arange(NA_F) * 30.0]
            h["entry/sample/rotation_angle"].attrs["units"] = "degree"
        else:
            h["exchange/data"] = proj
            h["exchange/data_white"] = flats
            h["exchange/data_dark"] = darks
            h["exchange/theta"] = np.arange(NA_F) * 30.0
    return path, {}


def make_string_angles(folder: Path, i: int):
    """``rotation_angle`` (and its kin in the other formats) as text."""
    rng = np.random.default_rng(2000 + i)
    sino = rng.uniform(0.1, 2, (NA_F, ND_F)).astype(np.float32)
    texts = [np.array([str(30 * k).encode() for k in range(NA_F)]),           # bytes array
             np.array([str(30 * k) for k in range(NA_F)], dtype=h5py.string_dtype()),
             "0, 30, 60, 90, 120, 150",                                       # one string
             np.array([f"{30 * k} deg" for k in range(NA_F)], dtype=h5py.string_dtype()),
             "nan", ""]
    value = texts[i % len(texts)]
    fmt = ("nxtomo", "dxchange", "hdf5", "npz", "sidecar")[(i // len(texts)) % 5]
    if fmt == "nxtomo":
        path = folder / f"sa{i}.nxs"
        with h5py.File(path, "w") as h:
            h["entry/instrument/detector/data"] = sino
            h["entry/sample/rotation_angle"] = value
            h["entry/sample/rotation_angle"].attrs["units"] = "degree"
    elif fmt == "dxchange":
        path = folder / f"sa{i}.h5"
        with h5py.File(path, "w") as h:
            h["exchange/data"] = sino[:, None, :]
            h["exchange/theta"] = value
    elif fmt == "hdf5":
        path = folder / f"sa{i}.h5"
        with h5py.File(path, "w") as h:
            h["sino"] = sino
            h["sino"].attrs["angles_deg"] = value
    elif fmt == "npz":
        path = folder / f"sa{i}.npz"
        v = value if isinstance(value, str) else np.asarray(value).astype(str)
        np.savez(path, sinogram=sino, angles_deg=np.asarray(v))
    else:
        path = folder / f"sa{i}.npy"
        np.save(path, sino)
        v = value if isinstance(value, str) else [str(x) for x in np.asarray(value).astype(str)]
        (folder / f"sa{i}.json").write_text(json.dumps({"angles_deg": v}))
    return path, {}


def make_links(folder: Path, i: int):
    """External links, soft-link loops, dangling links and group cycles (hard links)."""
    rng = np.random.default_rng(3000 + i)
    sino = rng.uniform(0.1, 2, (NA_F, ND_F)).astype(np.float32)
    how = ("external data", "external missing file", "external angles", "soft loop",
           "soft self", "dangling soft", "group cycle", "group cycle plain", "deep soft chain",
           "soft loop beside", "external allowed")[i % 11]
    path = folder / f"ln{i}.nxs"
    other = folder / f"other{i}.h5"
    with h5py.File(other, "w") as o:
        o["d"] = sino
        o["a"] = np.arange(NA_F) * 30.0
    D, A = "entry/instrument/detector/data", "entry/sample/rotation_angle"
    with h5py.File(path, "w") as h:
        if how == "group cycle plain":
            h["g/sino"] = sino
            h["g/sino"].attrs["angles_deg"] = np.arange(NA_F) * 30.0
            h["g/inner/back"] = h["g"]
            return path, {}
        h[D] = sino
        h[A] = np.arange(NA_F) * 30.0
        h[A].attrs["units"] = "degree"
        det = h["entry/instrument/detector"]
        if how in ("external data", "external allowed"):
            del h[D]
            h[D] = h5py.ExternalLink(other.name, "/d")
        elif how == "external missing file":
            del h[D]
            h[D] = h5py.ExternalLink("no_such_file.h5", "/d")
        elif how == "external angles":
            del h[A]
            h[A] = h5py.ExternalLink(other.name, "/a")
        elif how == "soft loop":
            del h[D]
            det["a"] = h5py.SoftLink("/entry/instrument/detector/b")
            det["b"] = h5py.SoftLink("/entry/instrument/detector/a")
            h[D] = h5py.SoftLink("/entry/instrument/detector/a")
        elif how == "soft self":
            del h[D]
            h[D] = h5py.SoftLink("/" + D)
        elif how == "dangling soft":
            del h[D]
            h[D] = h5py.SoftLink("/entry/nowhere")
        elif how == "group cycle":
            h["entry/instrument/loop"] = h["entry"]
            h["entry/loop2"] = h["/"]
        elif how == "deep soft chain":
            det["l0"] = h5py.SoftLink("/" + D)
            for k in range(1, 60):
                det[f"l{k}"] = h5py.SoftLink(f"/entry/instrument/detector/l{k - 1}")
        elif how == "soft loop beside":
            h["extra/a"] = h5py.SoftLink("/extra/b")
            h["extra/b"] = h5py.SoftLink("/extra/a")
    return path, ({"allow_external": True} if how == "external allowed" else {})


def make_big_chunks(folder: Path, i: int):
    """A small dataset declared with chunks far larger than itself (compressed, so the
    file stays small; one chunk must be unpacked whole to read any value)."""
    rng = np.random.default_rng(4000 + i)
    sino = rng.uniform(0.1, 2, (NA_F, ND_F)).astype(np.float32)
    chunks = [(2048, 2048), (1, 2**22), (4096, 1024), (512, 512)][i % 4]
    fmt = ("nxtomo", "hdf5")[(i // 4) % 2]
    path = folder / f"ch{i}{'.nxs' if fmt == 'nxtomo' else '.h5'}"
    with h5py.File(path, "w") as h:
        name = "entry/instrument/detector/data" if fmt == "nxtomo" else "sino"
        ds = h.create_dataset(name, shape=sino.shape, maxshape=(None, None), chunks=chunks,
                              dtype="f4", compression="gzip")
        ds[...] = sino
        if fmt == "nxtomo":
            h["entry/sample/rotation_angle"] = np.arange(NA_F) * 30.0
            h["entry/sample/rotation_angle"].attrs["units"] = "degree"
        else:
            ds.attrs["angles_deg"] = np.arange(NA_F) * 30.0
    # 10 MiB: the 16-32 MiB chunks are over the budget, the 1 MiB one under it
    return path, {"max_memory_gib": 0.01}


def make_odd_dtypes(folder: Path, i: int):
    """Complex, boolean and half-precision data in every format."""
    rng = np.random.default_rng(5000 + i)
    dtype = (np.complex64, np.complex128, np.bool_, np.float16)[i % 4]
    fmt = ("npy", "npz", "hdf5", "nxtomo", "dxchange", "tiff")[(i // 4) % 6]
    sino = rng.uniform(0.1, 2, (NA_F, ND_F))
    data = (sino > 1) if dtype is np.bool_ else (sino + 1j * sino if dtype in
                                                 (np.complex64, np.complex128) else sino)
    data = np.asarray(data, dtype=dtype)
    angles = np.arange(NA_F) * 30.0
    options: dict = {}
    if fmt == "npy":
        path = folder / f"dt{i}.npy"
        np.save(path, data)
        options = {"angles": angles}
    elif fmt == "npz":
        path = folder / f"dt{i}.npz"
        np.savez(path, sinogram=data, angles_deg=angles)
    elif fmt == "tiff":
        import tifffile

        path = folder / f"dt{i}.tif"
        tifffile.imwrite(path, data)
        options = {"angles": angles}
    else:
        path = folder / f"dt{i}{'.nxs' if fmt == 'nxtomo' else '.h5'}"
        with h5py.File(path, "w") as h:
            if fmt == "nxtomo":
                h["entry/instrument/detector/data"] = data
                h["entry/sample/rotation_angle"] = angles
                h["entry/sample/rotation_angle"].attrs["units"] = "degree"
            elif fmt == "dxchange":
                h["exchange/data"] = data[:, None, :]
                h["exchange/theta"] = angles
            else:
                h["sino"] = data
                h["sino"].attrs["angles_deg"] = angles
    return path, options


GENERATED = {"flats equal to darks": make_flats_equal_darks,
             "string rotation_angle": make_string_angles,
             "HDF5 links (external, soft loops, group cycles)": make_links,
             "gigantic chunk shape": make_big_chunks,
             "complex, bool, float16 data": make_odd_dtypes}
#: Inputs per category: (default suite, slow run).
GENERATED_N = {"flats equal to darks": (16, 64), "string rotation_angle": (30, 90),
               "HDF5 links (external, soft loops, group cycles)": (22, 66),
               "gigantic chunk shape": (8, 24), "complex, bool, float16 data": (24, 72)}


def _generated(tmp_path_factory, out_dir, category, slow: bool):
    folder = tmp_path_factory.mktemp("gen")
    n = GENERATED_N[category][1 if slow else 0]
    cases = [GENERATED[category](folder, i) for i in range(n)]
    chunks = category == "gigantic chunk shape"
    _entry_points(tmp_path_factory, out_dir, cases, category,
                  info_every=1 if slow else 6, napari_every=(0 if chunks else 1) if slow else 0,
                  batch_every=(0 if chunks else 5) if slow else 0,
                  info_args=("--max-memory-gib", "0.01") if chunks else ())


@pytest.mark.parametrize("category", sorted(GENERATED))
def test_generated_inputs(tmp_path_factory, out_dir, category):
    _generated(tmp_path_factory, out_dir, category, slow=False)


@pytest.mark.slow
@LONG
@pytest.mark.parametrize("category", sorted(GENERATED))
def test_generated_inputs_slow(tmp_path_factory, out_dir, category):
    _generated(tmp_path_factory, out_dir, category, slow=True)


# -- a disk that fills during the write ---------------------------------------------------------


def _disk_case(disk: Path, i: int, category: str, out_dir: Path | None) -> None:
    """Fill the disk to some level, then write a result, a sinogram, ``ctuq simulate``'s
    file or (with ``out_dir``) a whole batch into it: written whole, or one clear error
    with nothing left behind and the files already there intact."""
    from ctuq.app.cli import main
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Result, Sinogram, read_result, read_sinogram, write_result, \
        write_sinogram

    rng = np.random.default_rng(6000 + i)
    for p in disk.iterdir():
        p.unlink()
    filler = disk / "user file"
    filler.write_bytes(rng.bytes(int(rng.integers(0, 190)) * 1024))
    before = {p.name: _sha(p) for p in disk.iterdir()}
    kind = ("result", "sinogram", "simulate", "batch")[i % 4 if out_dir else i % 3]
    n = int(rng.integers(8, 120))
    target = disk / f"out{i}.h5"
    outcome, detail = "ok", ""
    try:
        if kind == "result":
            r = Result(rng.random((n, n)), rng.random((n, n)), samples=rng.random((2, n, n)))
            write_result(target, r)
            assert read_result(target) == r
        elif kind == "sinogram":
            g = Geometry.parallel(n, int(rng.integers(4, 200)))
            write_sinogram(target, Sinogram(rng.random(g.range_shape), g))
            read_sinogram(target)
        elif kind == "simulate":
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["simulate", str(target), "--size", str(n), "--angles",
                           str(int(rng.integers(4, 200)))])
            detail = err.getvalue()
            if rc == 2 and detail.startswith("error:") and "Traceback" not in detail:
                outcome = "clear_error"
            elif rc != 0:
                outcome = "traceback"
            else:
                read_sinogram(target)
        else:   # a batch whose result lands on the full disk
            from ctuq.app.batch import run_batch

            sino = out_dir / "disk_input.h5"
            if not sino.exists():
                assert main(["simulate", str(sino), "--size", "28", "--angles", "20"]) == 0
            target = disk / "disk_input.ctuq.h5"
            [o] = run_batch([sino], disk, TINY)
            detail = o.error or ""
            outcome = "ok" if o.status == "done" else (
                "clear_error" if "internal error" not in detail else "traceback")
            if o.status == "done":
                read_result(target)
    except InputError as err:
        outcome, detail = ("clear_error" if err.file and _names(err.file, target)
                           else "traceback"), str(err)
    except Exception as exc:  # noqa: BLE001
        outcome, detail = "traceback", repr(exc)
    after = {p.name: _sha(p) for p in disk.iterdir()}
    left = set(after) - set(before) - ({target.name} if outcome == "ok" else set())
    if any(after.get(k) != v for k, v in before.items()):
        outcome = "input_modified"
    elif left:
        outcome, detail = "output_lost", f"left behind: {sorted(left)}"   # a partial output
    _record(category, outcome, detail)


def test_disk_fills_during_the_write(small_disk):
    for i in range(9):
        _disk_case(small_disk, i, "disk fills during the write", None)


@pytest.mark.slow
@LONG
def test_disk_fills_during_the_write_slow(small_disk, out_dir):
    for i in range(12, 72):
        _disk_case(small_disk, i, "disk fills during the write", out_dir if i % 15 == 0 else None)


# -- odd file names -------------------------------------------------------------------------------
ODD_NAMES = ["with space.nxs", "ünïcødé σ 数据.nxs", "new\nline.nxs", "-dash.nxs",
             "--looks-like-a-flag.nxs", "[bold] markup :x:.nxs", "tab\there.nxs", "'quote\".nxs",
             " leading space.nxs", "x" * 200 + ".nxs"]


def _odd_name_cases(tmp_path_factory, out_dir, names, slow: bool):
    from ctuq.app.cli import main
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram

    folder = tmp_path_factory.mktemp("names")
    g = Geometry.parallel(28, 20)
    rng = np.random.default_rng(7)
    paths = []
    for name in names:
        p = folder / name
        write_sinogram(p, Sinogram(rng.uniform(0, 1, g.range_shape), g, {"noise_std": 0.05}))
        paths.append(p)
        run_api(p, "odd file names: read_sinogram")
        run_info(p, "odd file names: ctuq info")
        if slow or len(paths) == 1:
            run_napari_reader(p, "odd file names: napari reader")
    # the real process, given the names as a shell user would (relative; after '--')
    for p in (paths if slow else paths[3:4]):
        before = _sha(p)
        args = (["info", "--", p.name] if p.name.startswith("-") else ["info", p.name])
        proc = subprocess.run([sys.executable, "-m", "ctuq.app.cli", *args], cwd=folder,
                              capture_output=True, text=True, timeout=READ_LIMIT + 60)
        outcome = ("crash" if proc.returncode < 0 else "input_modified" if _sha(p) != before
                   else "ok" if proc.returncode == 0 else
                   "clear_error" if proc.returncode == 2 and "Traceback" not in proc.stderr
                   else "traceback")
        _record("odd file names: ctuq process", outcome, proc.stderr)
    # one batch over all of them: the results are named after each, the table prints
    if slow:
        t0 = time.monotonic()
        out = tmp_path_factory.mktemp("names_out")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as so:
            rc = main(["reconstruct", *map(str, paths), "--out", str(out),
                       "--config", str(_tiny_toml(folder))])
        from ctuq.app.batch import output_path
        from ctuq.data.io import read_result

        for p in paths:
            ok = rc == 0 and (out / output_path(p, out).name).is_file()
            if ok:
                read_result(output_path(p, out))
            _record("odd file names: ctuq reconstruct",
                    "ok" if ok else ("hang" if time.monotonic() - t0 > CASE_LIMIT * len(paths)
                                     else "traceback"), err.getvalue() + so.getvalue())


def _tiny_toml(folder: Path) -> Path:
    path = folder.parent / "tiny_fuzz.toml"
    u = TINY["uncertainty"]
    path.write_text(f'preset = "reference-28"\nthreads = 1\n[dip]\niterations = '
                    f'{TINY["dip"]["iterations"]}\n[uncertainty]\n'
                    + "".join(f"{k} = {str(v).lower()}\n" for k, v in u.items()))
    return path


def test_odd_file_names(tmp_path_factory, out_dir):
    _odd_name_cases(tmp_path_factory, out_dir, ODD_NAMES[:4], slow=False)


@pytest.mark.slow
@LONG
def test_odd_file_names_slow(tmp_path_factory, out_dir):
    _odd_name_cases(tmp_path_factory, out_dir, ODD_NAMES, slow=True)


# -- files the batch writes that are inputs; the scheduler ----------------------------------------
def _usage_error_case(category: str, argv: list, inputs: list[Path], out: Path,
                      limit: float = 15.0) -> None:
    """``ctuq reconstruct`` refused before any work: exit 2, one error line, inputs
    unchanged, nothing created, within ``limit`` seconds."""
    from ctuq.app.cli import main

    before = {p: _sha(p) for p in inputs}
    existed = out.exists() and sorted(q.name for q in out.iterdir())
    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["reconstruct", *map(str, argv)])
    took = time.monotonic() - t0
    text = err.getvalue()
    if took > limit:
        outcome = "hang"
    elif any(_sha(p) != d for p, d in before.items()):
        outcome = "input_modified"
    elif (sorted(q.name for q in out.iterdir()) if out.exists() else False) != existed:
        outcome = "output_lost"
    elif rc == 2 and text.startswith("error:") and "internal error" not in text \
            and "Traceback" not in text:
        outcome = "clear_error"
    else:
        outcome = "traceback"
    _record(category, outcome, f"rc {rc}: {text}")


@pytest.fixture(scope="module")
def two_scans(tmp_path_factory):
    from ctuq.app.cli import main

    d = tmp_path_factory.mktemp("scans")
    for name in ("a.nxs", "b.h5"):
        assert main(["simulate", str(d / name), "--size", "16", "--angles", "8"]) == 0
    return d




def test_files_written_onto_inputs_are_refused(tmp_path, two_scans):
    """An output, the lock or the summary JSON that is an input (by name, symlink or
    hardlink): refused before any work, the input intact."""
    import shutil

    a, b = two_scans / "a.nxs", two_scans / "b.h5"
    cases = []
    for i, how in enumerate(("copy", "symlink", "hardlink")):
        out = tmp_path / f"out{i}"
        out.mkdir()
        victim = out / "a.ctuq.h5"                   # a's output is the second input
        if how == "copy":
            shutil.copy(b, victim)
            second = victim
        else:
            second = tmp_path / f"b{i}.h5"
            shutil.copy(b, second)
            (os.symlink if how == "symlink" else os.link)(second, victim)
        cases.append(("an output that is an input", [a, second, "--out", out, "--overwrite"],
                      [a, second, victim], out))
    lock_out = tmp_path / "lock_out"
    lock_out.mkdir()
    shutil.copy(b, lock_out / ".ctuq-batch.lock")
    cases.append(("an output that is an input", [a, lock_out / ".ctuq-batch.lock", "--out",
                                                 lock_out], [lock_out / ".ctuq-batch.lock"],
                  lock_out))
    for target in (a, b):
        cases.append(("--summary-json onto an input",
                      [a, b, "--out", tmp_path / "s_out", "--summary-json", target],
                      [a, b], tmp_path / "s_out"))
    for category, argv, inputs, out in cases:
        _usage_error_case(category, argv, inputs, out)
    # the library call the CLI makes, with the summary's path
    from ctuq.app.batch import run_batch

    for target in (a, b):
        before = _sha(target)
        try:
            run_batch([a, b], tmp_path / "api_out", TINY, also_writes=[target])
            outcome = "traceback"                    # it ran: the summary would overwrite
        except InputError as err:
            outcome = "clear_error" if "summary" in str(err) else "traceback"
        if _sha(target) != before:
            outcome = "input_modified"
        _record("--summary-json onto an input", outcome)
    assert not (tmp_path / "api_out").exists()




SCHEDULERS = ["tcp://127.0.0.1:{free}", "127.0.0.1:{free}", "nonsense", "tcp://", "tcp://host",
              "tcp://127.0.0.1:99999", "tls://127.0.0.1:{free}", "tcp://[::1]:{free}",
              "tcp://no-such-host.invalid:8786", " ", "ucx://127.0.0.1:{free}"]


def test_unreachable_scheduler(tmp_path, two_scans):
    """Each a usage error within seconds, nothing computed, no output folder made."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    a = two_scans / "a.nxs"
    for i, address in enumerate(SCHEDULERS):
        out = tmp_path / f"o{i}"
        _usage_error_case("unreachable --scheduler",
                          [a, "--out", out, "--scheduler", address.format(free=free)], [a], out)
