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
    """The message names the file (the console may have wrapped it)."""
    return "".join(path.name.split()) in "".join(text.split())


# -- entry points ------------------------------------------------------------------------
def run_info(path: Path, category: str) -> str:
    """``ctuq info`` in this process (the file itself is read in a child)."""
    from ctuq.app.cli import main

    before = _sha(path)
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["info", str(path), "--read-timeout", str(READ_LIMIT)])
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

