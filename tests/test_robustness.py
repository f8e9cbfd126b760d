"""Issue 25, defect by defect: each test reproduces one numbered defect (it fails
on the code before the fix) and checks the fixed behaviour.

Crashes and hangs of the HDF5 library are injected into the reading child
process through a ``sitecustomize`` module on its ``PYTHONPATH``: h5py
segfaults (or sleeps) when asked to open a file whose name carries a marker.
That is the same failure the issue's corrupt files cause, made reproducible.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from ctuq.app.batch import folder_lock, run_batch
from ctuq.app.cli import main
from ctuq.data.geometry import Geometry
from ctuq.data.io import (Sinogram, atomic_output, read_sinogram, read_sinogram_isolated,
                          remove_stale_temporaries, write_sinogram)
from ctuq.errors import InputError
from ctuq.recon.config import ReconstructionConfig

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = {"preset": "reference-28", "threads": 1, "dip": {"iterations": 10},
        "uncertainty": {"em_steps": 1, "n_samples": 2, "predictive_samples": 4,
                        "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                        "cg_max_iter": 20}}
CRASH, HANG = "zz-segfault-me", "zz-hang-me"

SITECUSTOMIZE = f'''
import h5py
_open = h5py.File.__init__
def _init(self, name, *args, **kwargs):
    text = str(name)
    if "{CRASH}" in text:
        import ctypes
        ctypes.string_at(0)          # a segmentation fault, as a corrupt B-tree gives
    if "{HANG}" in text:
        import time
        time.sleep(3600)             # an endless loop in the library
    return _open(self, name, *args, **kwargs)
h5py.File.__init__ = _init
'''


@pytest.fixture
def injected(tmp_path, monkeypatch):
    """Reading children crash or hang on marked file names."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep))
    return site


def _sino(path, n=16, angles=10, seed=0):
    g = Geometry.parallel(n, angles)
    rng = np.random.default_rng(seed)
    s = Sinogram(rng.uniform(0, 1, g.range_shape).astype(np.float32), g,
                 {"noise_std": 0.05}, ground_truth=rng.uniform(0, 1, (n, n)).astype(np.float32))
    return write_sinogram(path, s)


# -- 1. data loss ------------------------------------------------------------------------
def test_1_cleanup_deletes_only_its_own_stale_temporaries(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    scan = _sino(out / ".myscan.tmp")                 # an input named like a temporary
    (out / ".notes.tmp").write_text("mine")           # a user's file
    (out / ".x.h5.0123456789ab.tmp").write_text("old-style name: not provably ours")
    stale_tmp = out / ".ctuq-00000000000000aa.r.h5.tmp"
    stale_tmp.write_text("left by a killed run")
    (out / ".ctuq-00000000000000aa.lock").write_text("")   # unlocked: its writer is gone
    live = {}
    ready, release = threading.Event(), threading.Event()

    def writer():  # a concurrent write in progress (holds its lock)
        with atomic_output(out / "live.h5") as tmp:
            live["tmp"] = tmp
            Path(tmp).write_text("half-written")
            ready.set()
            release.wait(60)

    t = threading.Thread(target=writer)
    t.start()
    ready.wait(30)
    try:
        removed = remove_stale_temporaries(out, protect=[scan])
        assert removed == [stale_tmp]
        assert live["tmp"].exists() and (out / ".notes.tmp").read_text() == "mine"
        assert scan.exists() and (out / ".x.h5.0123456789ab.tmp").exists()
    finally:
        release.set()
        t.join()
    assert (out / "live.h5").read_text() == "half-written"
    # and a whole batch with the input among the hidden names reconstructs it
    res = run_batch([scan], out, TINY)
    assert [o.status for o in res] == ["done"], res
    assert scan.exists() and (out / ".notes.tmp").exists()


def test_1_concurrent_run_into_one_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "a.h5").write_bytes(b"x")
    with folder_lock(out, "first"):
        with pytest.raises(InputError, match="another ctuq reconstruct") as ei:
            run_batch([tmp_path / "a.h5"], out, TINY)
        assert "first" in str(ei.value) and str(os.getpid()) in str(ei.value)
    assert not (out / ".ctuq-batch.lock").exists()  # released and removed


def test_1_two_real_runs_into_one_folder(tmp_path):
    """Two ``ctuq reconstruct`` processes at once: one works, the other is refused
    clearly; nothing is lost, every output is complete."""
    for i in range(2):
        _sino(tmp_path / f"s{i}.h5", seed=i)
    cmd = [sys.executable, "-m", "ctuq.app.cli", "reconstruct", str(tmp_path / "s0.h5"),
           str(tmp_path / "s1.h5"), "--out", str(tmp_path / "out"), "--preset",
           "reference-28", "--threads", "1"]
    toml = tmp_path / "tiny.toml"
    toml.write_text("[dip]\niterations = 10\n[uncertainty]\nem_steps = 1\nn_samples = 2\n"
                    "predictive_samples = 4\nstored_samples = 0\npredcp = false\n"
                    "preconditioner_rank = 8\ncg_max_iter = 20\n")
    cmd += ["--config", str(toml)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "out" / ".ctuq-batch.lock").exists() and time.time() < deadline:
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    out1, err1 = first.communicate(timeout=900)
    assert first.returncode == 0, err1
    assert second.returncode == 2 and "another ctuq reconstruct" in second.stderr
    assert "Traceback" not in second.stderr
    from ctuq.data.io import read_result

    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["s0.ctuq.h5", "s1.ctuq.h5"]
    for n in names:
        read_result(tmp_path / "out" / n)
    # run again now that the first is done: both skipped, nothing rewritten
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count("skipped") >= 2


# -- 2. crashes and hangs ----------------------------------------------------------------
def test_2_a_crashing_input_is_one_failed_row(tmp_path, injected):
    a, b = _sino(tmp_path / "a.h5"), _sino(tmp_path / "b.h5", seed=1)
    bad = _sino(tmp_path / f"{CRASH}.h5", seed=2)
    res = run_batch([a, bad, b], tmp_path / "out", TINY)
    assert [o.status for o in res] == ["done", "failed", "done"]
    assert "crashed the reader" in res[1].error and "SIGSEGV" in res[1].error
    with pytest.raises(InputError, match="crashed"):
        read_sinogram_isolated(bad)


def test_2_a_hanging_input_times_out(tmp_path, injected):
    bad = _sino(tmp_path / f"{HANG}.h5")
    t0 = time.monotonic()
    cfg = {**TINY, "read": {"read_timeout": 3.0}}
    res = run_batch([bad], tmp_path / "out", cfg)
    assert res[0].status == "failed" and "longer than 3 s" in res[0].error
    assert time.monotonic() - t0 < 60


def test_2_info_survives_a_crash(tmp_path, injected, capsys):
    bad = _sino(tmp_path / f"{CRASH}.h5")
    assert main(["info", str(bad)]) == 2
    assert "crashed" in capsys.readouterr().err


@pytest.mark.parametrize("offset", [2992, 16480, 20528, 22896, 30816])
def test_2_the_issues_corrupt_files_are_clear_errors(tmp_path, offset):
    """The issue's corruptions of ``ctuq simulate --size 16 --angles 10`` (segfaults of
    the HDF5 library at four offsets, a hang at 2992): one error naming the file."""
    assert main(["simulate", str(tmp_path / "s.h5"), "--size", "16", "--angles", "10"]) == 0
    blob = bytearray((tmp_path / "s.h5").read_bytes())
    blob[offset:offset + 8] = bytes(8)
    bad = tmp_path / f"z{offset}.h5"
    bad.write_bytes(bytes(blob))
    t0 = time.monotonic()
    with pytest.raises(InputError) as ei:
        read_sinogram_isolated(bad, timeout=20)
    assert ei.value.file is not None and bad.name in str(ei.value)
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("angle", [1e300, -1e300])
def test_2_absurd_angles_are_refused_at_once(tmp_path, angle):
    t0 = time.monotonic()
    with pytest.raises(InputError, match="turns"):
        Geometry.parallel(16, angles=[0.0, 0.5, angle])
    assert time.monotonic() - t0 < 5


def test_2_absurd_sample_count_is_refused():
    with pytest.raises(InputError, match="uncertainty.predictive_samples"):
        ReconstructionConfig(uncertainty={"predictive_samples": 10**9})


# -- 3. silent misreads -------------------------------------------------------------------
def _corrupt_object_header(path, name):
    """Overwrite the object header of dataset ``name`` with zeros (its link stays)."""
    with h5py.File(path, "r") as h:
        addr = h5py.h5o.get_info(h[name].id).addr
    with open(path, "r+b") as fh:
        fh.seek(addr)
        fh.write(b"\0" * 16)


def test_3_a_corrupt_optional_field_is_an_error_not_absent(tmp_path):
    path = _sino(tmp_path / "s.nxs")
    _corrupt_object_header(path, "/entry/sample/ground_truth")
    with pytest.raises(InputError) as ei:
        read_sinogram(path)
    assert "ground_truth" in str(ei.value)


def test_3_fan_beam_with_corrupt_source_distance_is_not_parallel(tmp_path):
    g = Geometry.fan(16, 12)
    path = write_sinogram(tmp_path / "f.nxs", Sinogram(np.ones(g.range_shape, np.float32), g))
    _corrupt_object_header(path, "/entry/instrument/source/distance")
    with pytest.raises(InputError) as ei:
        read_sinogram(path)
    assert "source/distance" in str(ei.value)


# -- 4. header sizes -------------------------------------------------------------------------
def test_4_huge_declared_hdf5_dataset_is_refused_before_reading(tmp_path, capsys):
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as h:
        h.create_dataset("sino", shape=(200000, 200000), dtype="f4", chunks=(100, 100))
    assert path.stat().st_size < 100_000
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "memory budget" in err and "Traceback" not in err


def test_4_a_gzip_bomb_is_refused_under_the_budget(tmp_path):
    path = tmp_path / "bomb.h5"
    with h5py.File(path, "w") as h:
        h.create_dataset("sino", data=np.zeros((2000, 3000), np.float32), compression="gzip",
                         compression_opts=9, chunks=(500, 500))
    assert path.stat().st_size < 1_000_000          # 24 MB of zeros inflate from a few kB
    with pytest.raises(InputError, match="memory budget"):
        read_sinogram(path, n_angles=2000, max_memory_gib=0.1)
    # and an image too large for the budget is refused before any work
    import ctuq

    g = Geometry.parallel(64, 8)
    with pytest.raises(InputError, match="image_size"):
        ctuq.reconstruct(Sinogram(np.zeros(g.range_shape, np.float32), g),
                         ReconstructionConfig(read={"max_memory_gib": 0.01}))


def test_4_npy_header_is_checked_before_allocation(tmp_path):
    path = tmp_path / "huge.npy"
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (200000, 200000)})
        fh.write(b"\0" * 64)
    with pytest.raises(InputError, match="memory budget"):
        read_sinogram(path, n_angles=200000)
    with pytest.raises(InputError, match="truncated"):
        read_sinogram(path, n_angles=200000, max_memory_gib=10**5)


def test_4_tiff_header_is_checked_before_allocation(tmp_path):
    import tifffile

    path = tmp_path / "big.tif"
    tifffile.imwrite(path, np.zeros((3000, 3000), np.float32), compression="zlib")
    with pytest.raises(InputError, match="memory budget"):
        read_sinogram(path, n_angles=3000, max_memory_gib=0.05)


# -- 3/8. external files ------------------------------------------------------------------------
def test_3_external_storage_and_links_are_refused_unless_allowed(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(60, dtype="<f4").tobytes())
    ext = tmp_path / "ext.h5"
    with h5py.File(ext, "w") as h:
        h.create_dataset("sino", shape=(6, 10), dtype="<f4",
                         external=[(str(secret), 0, 240)])
    with pytest.raises(InputError, match="external file"):
        read_sinogram(ext, n_angles=6)
    ok = read_sinogram(ext, n_angles=6, allow_external=True)
    assert ok.data[0, 1] == 1.0
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h:
        h["sino"] = np.ones((6, 10), np.float32)
    linked = tmp_path / "linked.h5"
    with h5py.File(linked, "w") as h:
        h["sino"] = h5py.ExternalLink(str(other), "/sino")
    with pytest.raises(InputError, match="external link"):
        read_sinogram(linked, dataset="/sino", n_angles=6)
    assert read_sinogram(linked, dataset="/sino", n_angles=6, allow_external=True).shape \
        == (6, 10)


# -- 3/7. angles ----------------------------------------------------------------------------------
def test_7_descending_equispaced_angles_reconstruct(tmp_path):
    """171 deg -> 9 deg, 10 deg apart, in an NXtomo file (was: 'upper end smaller')."""
    import torch

    from ctuq.data.operators import RayTransform
    from ctuq.recon.baselines import fbp_reconstruction

    deg = np.arange(171.0, 8.0, -10.0)
    truth = np.zeros((16, 16), np.float32)
    truth[3:7, 4:12] = 1
    g = Geometry((16, 16), np.deg2rad(deg), 24)
    y = RayTransform(g).A(torch.from_numpy(truth)).numpy()
    path = tmp_path / "desc.nxs"
    with h5py.File(path, "w") as h:
        h["entry/instrument/detector/data"] = y
        h["entry/sample/rotation_angle"] = deg
        h["entry/sample/rotation_angle"].attrs["units"] = "degree"
    s = read_sinogram(path, image_size=16)
    np.testing.assert_allclose(s.geometry.angles_deg, deg)
    rec = fbp_reconstruction(torch.from_numpy(s.data), RayTransform(s.geometry)).numpy()
    assert np.corrcoef(rec.ravel(), truth.ravel())[0, 1] > 0.8


def test_3_angles_unit_plausibility(tmp_path, caplog):
    theta = np.linspace(0.08, 3.06, 30)        # radians, no units attribute (issue 22)
    path = tmp_path / "dx.h5"
    with h5py.File(path, "w") as h:
        h["exchange/data"] = np.ones((30, 1, 20), np.float32)
        h["exchange/theta"] = theta
    with pytest.raises(InputError, match="radians or degrees") as ei:
        read_sinogram(path)
    assert "theta" in str(ei.value) and "--angle-unit" in str(ei.value)
    s = read_sinogram(path, angle_unit="rad")
    np.testing.assert_allclose(s.geometry.angles, theta)
    with h5py.File(path, "a") as h:
        h["exchange/theta"].attrs["units"] = "radians"
        h["exchange/theta"][...] = np.linspace(0, 179, 30)   # degrees, declared radians
    with pytest.raises(InputError, match="more than one turn"):
        read_sinogram(path)
    with h5py.File(path, "a") as h:
        h["exchange/theta"][...] = np.array([0, 1, np.nan] + [3.0] * 27)
    with pytest.raises(InputError, match="non-finite"):
        read_sinogram(path)


# -- 6. settings ------------------------------------------------------------------------------------
BAD_SETTINGS = [
    ({"device": "tpu"}, "device"), ({"device": ""}, "device"), ({"device": 5}, "device"),
    ({"dip": {"iterations": float("nan")}}, "dip.iterations"),
    ({"noise_std": True}, "noise_std"), ({"dip": {"lr": True}}, "dip.lr"),
    ({"dip": {"iterations": "10"}}, "dip.iterations"), ({"dip": {"warmup": -5}}, "dip.warmup"),
    ({"dip": {"lr_min_factor": float("nan")}}, "dip.lr_min_factor"),
    ({"uncertainty": {"learn_noise": "maybe"}}, "uncertainty.learn_noise"),
    ({"uncertainty": {"predcp": "no"}}, "uncertainty.predcp"),
    ({"seed": 1.5}, "seed"), ({"threads": 0}, "threads"),
    ({"geometry": {"center_offset": float("inf")}}, "geometry.center_offset"),
    ({"read": {"convention": "matlab"}}, "read.convention"),
]


@pytest.mark.parametrize("settings, key", BAD_SETTINGS,
                         ids=[k for _, k in BAD_SETTINGS])
def test_6_settings_are_validated_naming_the_key(settings, key, tmp_path):
    with pytest.raises(InputError) as ei:
        ReconstructionConfig.from_dict(settings)
    assert ei.value.field == key, ei.value
    # the same from a TOML file: the error names the file too

    lines = []
    for k, v in settings.items():
        if isinstance(v, dict):
            lines.append(f"[{k}]")
            lines += [f"{kk} = {_toml(vv)}" for kk, vv in v.items()]
        else:
            lines.insert(0, f"{k} = {_toml(v)}")
    (tmp_path / "c.toml").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as ei:
        ReconstructionConfig.from_toml(tmp_path / "c.toml")
    assert ei.value.field == key and ei.value.file == str(tmp_path / "c.toml")


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and np.isnan(v):
        return "nan"
    if isinstance(v, float) and np.isinf(v):
        return "inf"
    return json.dumps(v)


@pytest.mark.parametrize("content", [b"\x00\x01\xff\xfe binary", "seed = 1".encode("utf-16")])
def test_6_undecodable_toml_is_a_clear_error(tmp_path, content):
    (tmp_path / "c.toml").write_bytes(content)
    with pytest.raises(InputError, match="UTF-8") as ei:
        ReconstructionConfig.from_toml(tmp_path / "c.toml")
    assert ei.value.field == "--config"


@pytest.mark.parametrize("value", ["0.1", 0.0, -1.0, float("nan"), True])
def test_6_noise_std_metadata_is_checked(tmp_path, value):
    g = Geometry.parallel(8, 6)
    with pytest.raises(InputError) as ei:
        Sinogram(np.ones(g.range_shape), g, {"noise_std": value, "source": "f.nxs"})
    assert ei.value.field == "meta.noise_std" and ei.value.file == "f.nxs"


# -- 8. smaller ---------------------------------------------------------------------------------------
def test_8_preview_into_a_directory_does_not_abort_the_batch(tmp_path, capsys):
    a = _sino(tmp_path / "a.h5")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.png").mkdir()              # where the preview goes
    (tmp_path / "t.toml").write_text(
        "preset = 'reference-28'\nthreads = 1\n[dip]\niterations = 10\n[uncertainty]\n"
        "em_steps = 1\nn_samples = 2\npredictive_samples = 4\nstored_samples = 0\n"
        "predcp = false\npreconditioner_rank = 8\ncg_max_iter = 20\n")
    rc = main(["reconstruct", str(a), "--out", str(tmp_path / "out"), "--preview",
               "--config", str(tmp_path / "t.toml")])
    text = capsys.readouterr()
    # the note is one line in a log file, whatever the path's length
    assert rc == 0 and "Traceback" not in text.err
    assert any("preview not written" in line and "a.png" in line
               for line in text.out.splitlines())
    assert (tmp_path / "out" / "a.ctuq.h5").exists()


def test_8_long_names_fail_before_the_work_or_work(tmp_path):
    long_ok = "x" * 240 + ".h5"                       # output name 248 bytes: fine
    a = _sino(tmp_path / long_ok)
    res = run_batch([a], tmp_path / "out", TINY)
    assert res[0].status == "done", res[0].error
    too_long = tmp_path / ("y" * 250 + ".h5")         # output name over 255 bytes
    too_long.write_bytes(a.read_bytes())
    t0 = time.monotonic()
    res = run_batch([too_long], tmp_path / "out2", TINY)
    assert res[0].status == "failed" and "file name" in res[0].error
    assert res[0].seconds < 30 and time.monotonic() - t0 < 60


def test_8_symlink_loop_is_a_clear_error(tmp_path):
    loop = tmp_path / "loop.h5"
    os.symlink(loop, loop)
    with pytest.raises(InputError, match="loop of symbolic links") as ei:  # a usage error
        run_batch([loop], tmp_path / "out", TINY)
    assert ei.value.file == str(loop) and not (tmp_path / "out").exists()


def test_8_a_retried_task_reports_done_not_skipped(tmp_path):
    """After a Dask worker dies having written the output, the retry says "done"."""
    from ctuq.app.batch import run_one

    a = _sino(tmp_path / "a.h5")
    out = tmp_path / "a.ctuq.h5"
    first = run_one(a, out, TINY, run_id="run1")
    assert first.status == "done"
    retry = run_one(a, out, TINY, run_id="run1")      # the same run, after a worker died
    assert retry.status == "done" and "earlier attempt" in retry.note
    later = run_one(a, out, TINY, run_id="run2")      # a later run resumes: skipped
    assert later.status == "skipped"


def test_8_results_record_versions_threads_device(tmp_path):
    from ctuq.data.io import read_result

    a = _sino(tmp_path / "a.h5")
    res = run_batch([a], tmp_path / "out", TINY)
    prov = read_result(res[0].output).provenance
    assert prov["threads"] == 1 and prov["device"] == "cpu"
    assert {"torch", "numpy", "h5py", "astra", "odl", "ctuq"} <= set(prov["versions"])
    assert prov["run_id"]


@pytest.mark.slow
def test_8_serial_and_dask_give_the_same_numbers(tmp_path):
    from ctuq.data.io import read_result

    paths = [_sino(tmp_path / f"s{i}.h5", seed=i) for i in range(2)]
    serial = run_batch(paths, tmp_path / "serial", TINY)
    dask = run_batch(paths, tmp_path / "dask", TINY, workers=2)
    assert [o.status for o in serial + dask] == ["done"] * 4
    for s, d in zip(serial, dask):
        rs, rd = read_result(s.output), read_result(d.output)
        np.testing.assert_array_equal(rd.reconstruction, rs.reconstruction)
        np.testing.assert_array_equal(rd.std, rs.std)
        assert rs.provenance["threads"] == rd.provenance["threads"] == 1


def test_killed_writer_leaves_a_removable_temporary(tmp_path):
    """A writer killed mid-write: its temporary is stale (lock free) and goes; the output
    never appears half-written."""
    code = ("import sys, time; from ctuq.data.io import atomic_output\n"
            "with atomic_output(sys.argv[1]) as t:\n"
            "    open(t, 'w').write('partial'); print('ready', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "r.h5")],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    assert remove_stale_temporaries(tmp_path) == []          # alive: untouched
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not (tmp_path / "r.h5").exists()
    removed = remove_stale_temporaries(tmp_path)
    assert len(removed) == 1 and removed[0].name.endswith(".r.h5.tmp")
    assert not [q for q in tmp_path.iterdir() if q.name.endswith(".tmp")]


# -- the hostile tester's second round: values that pass validation but not arithmetic ---------
@pytest.mark.parametrize("value, words", [(1e30, "at most"), (-1e30, "> 0"),
                                          (1e-300, "at least"), (1e20, "at most")])
def test_noise_std_must_survive_squaring_in_float32(value, words, tmp_path, capsys):
    """1e30 passed and ended in torch's overflow traceback; 1e-300 ended in an error
    about noise_var, a quantity the user never set. Both name noise_std now."""
    with pytest.raises(InputError) as ei:
        ReconstructionConfig.from_dict({**TINY, "noise_std": value})
    assert ei.value.field == "noise_std" and words in ei.value.message
    f32 = np.finfo(np.float32)
    for ok in (1e-18, 1e18):                            # inside: value and square are normal
        assert f32.tiny <= np.float32(ok) ** 2 <= f32.max
        ReconstructionConfig.from_dict({**TINY, "noise_std": ok})
    # the same check for a TOML file, naming the file and the key, exit 2
    (tmp_path / "c.toml").write_text(f"noise_std = {value!r}\n")
    (tmp_path / "s.npy").write_bytes(b"")
    assert main(["reconstruct", str(tmp_path / "s.npy"), "--out", str(tmp_path / "o"),
                 "--config", str(tmp_path / "c.toml")]) == 2
    err = "".join(capsys.readouterr().err.split())
    assert "noise_std" in err and "c.toml" in err and "Traceback" not in err


@pytest.mark.parametrize("data", [np.zeros((20, 28)), np.full((20, 28), 3.5)],
                         ids=["zeros", "constant"])
def test_a_constant_sinogram_is_refused_at_input(data):
    """An all-zero or constant sinogram through the API ended in
    'noise_var: must be a positive number, got 0.0' after the DIP fit."""
    import ctuq

    t0 = time.monotonic()
    with pytest.raises(InputError) as ei:
        ctuq.reconstruct(data, ReconstructionConfig.from_dict(TINY),
                         angles=np.arange(20) * 9.0, image_size=28)
    assert ei.value.field == "sinogram" and "constant" in ei.value.message
    assert time.monotonic() - t0 < 5                   # before any fit
    stack = np.stack([np.random.default_rng(0).random((20, 28)), data])
    with pytest.raises(InputError) as ei:              # one dead slice of a stack
        ctuq.reconstruct(stack, ReconstructionConfig.from_dict(TINY),
                         angles=np.arange(20) * 9.0, image_size=28)
    assert ei.value.field == "sinogram[1]"


def test_a_constant_sinogram_file_fails_naming_file_and_field(tmp_path):
    g = Geometry.parallel(28, 20)
    path = write_sinogram(tmp_path / "blank.nxs", Sinogram(np.zeros(g.range_shape), g))
    [o] = run_batch([path], tmp_path / "out", ReconstructionConfig.from_dict(TINY).to_dict())
    assert o.status == "failed" and o.seconds < 30
    assert "blank.nxs" in o.error and "sinogram" in o.error and "constant" in o.error
    assert not (tmp_path / "out" / "blank.ctuq.h5").exists()




def test_a_disk_that_fills_during_the_write_is_one_clear_error(small_disk):
    """A result larger than the free space: HDF5's own write failed half-way, the
    writer raised a raw OSError ("internal error" in a batch), h5py printed
    'Exception ignored' tracebacks, and the interpreter crashed (SIGSEGV) at exit
    flushing the dead file. Now: one InputError naming the file, nothing left behind,
    the files already there intact, a clean exit."""
    (small_disk / "keep.txt").write_text("a user's file")
    code = f"""
import numpy as np
from ctuq.data.geometry import Geometry
from ctuq.data.io import Result, Sinogram, write_result, write_sinogram
from ctuq.errors import InputError
rng = np.random.default_rng(0)
g = Geometry.parallel(128, 400)               # about 300 kB of data
for name, write in (("r.h5", lambda p: write_result(p, Result(rng.random((96, 96)),
                                                                rng.random((96, 96)),
                                                                samples=rng.random((4, 96, 96))))),
                    ("s.nxs", lambda p: write_sinogram(p, Sinogram(rng.random(g.range_shape), g)))):
    try:
        write({str(small_disk)!r} + "/" + name)
        print("written", name)
    except InputError as err:
        print("refused", err.field, name in str(err), "No space left" in str(err))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr[-2000:]
    assert p.stdout.splitlines() == ["refused output True True"] * 2, p.stdout
    assert sorted(q.name for q in small_disk.iterdir()) == ["keep.txt"]
    assert (small_disk / "keep.txt").read_text() == "a user's file"


def test_a_gigantic_chunk_shape_is_checked_against_the_budget(tmp_path):
    """HDF5 unpacks a whole chunk to read any value: 6 x 9 values declared with
    2048² chunks need 32 MiB, which the declared shape alone did not show."""
    path = tmp_path / "chunky.h5"
    with h5py.File(path, "w") as h:
        ds = h.create_dataset("sino", shape=(6, 9), maxshape=(None, None), chunks=(2048, 2048),
                              dtype="f4", compression="gzip")
        ds[...] = np.random.default_rng(0).random((6, 9))
        ds.attrs["angles_deg"] = np.arange(6) * 30.0
    assert path.stat().st_size < 200_000
    with pytest.raises(InputError, match="chunks of shape") as ei:
        read_sinogram(path, max_memory_gib=0.01)
    assert ei.value.field == "/sino" and ei.value.file == str(path)
    assert read_sinogram(path, max_memory_gib=1).data.shape == (6, 9)   # within the budget
