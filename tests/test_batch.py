"""End-to-end CLI and batch tests on tiny inputs (28², a few iterations)."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ctuq.app.batch import output_path, plan_outputs, run_batch
from ctuq.app.cli import main
from ctuq.data.io import read_result
from ctuq.errors import InputError
from ctuq.recon.config import ReconstructionConfig, tomllib

TINY = """
preset = "reference-28"
threads = 1
[dip]
iterations = 40
progress_every = 10
[uncertainty]
em_steps = 1
n_samples = 2
predictive_samples = 8
stored_samples = 2
predcp = false
preconditioner_rank = 16
cg_max_iter = 60
"""

TINY_DICT = ReconstructionConfig().merged(tomllib.loads(TINY)).to_dict()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    paths = []
    for seed in range(3):
        p = root / f"digit{seed}.h5"
        assert main(["simulate", str(p), "--phantom", "digits", "--size", "28",
                     "--angles", "20", "--seed", str(seed)]) == 0
        paths.append(p)
    (root / "tiny.toml").write_text(TINY)
    return root, paths


def _run(args):
    return main(["reconstruct", *map(str, args)])


def test_simulate_reconstruct_info(inputs, tmp_path, capsys):
    root, paths = inputs
    assert _run([paths[0], "--out", tmp_path, "--config", root / "tiny.toml"]) == 0
    out = output_path(paths[0], tmp_path)
    r = read_result(out)
    assert r.reconstruction.shape == (28, 28) and r.std.shape == (28, 28)
    assert np.all(r.std > 0) and "psnr" in r.metrics
    assert r.input_sha256 and r.seed == 0 and r.em_trace
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "reconstruction" in text and "psnr" in text.lower()


def test_corrupt_input_fails_alone(inputs, tmp_path, capsys):
    root, paths = inputs
    bad = tmp_path / "broken.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # an HDF5 signature, then nothing
    outdir = tmp_path / "out"
    rc = _run([paths[0], bad, paths[1], "--out", outdir, "--config", root / "tiny.toml"])
    text = capsys.readouterr()
    assert rc == 1
    assert "broken.h5" in text.out and "failed" in text.out
    assert sorted(p.name for p in outdir.iterdir()) == ["digit0.ctuq.h5", "digit1.ctuq.h5"]


def test_second_run_skips_complete_outputs_and_seed_reproduces(inputs, tmp_path):
    root, paths = inputs
    events = []
    first = run_batch(paths[:1], tmp_path / "a", TINY_DICT,
                      on_progress=lambda *e: events.append(e))
    # every event is tagged with its file and the stages arrive in pipeline order
    assert {e[0] for e in events} == {str(paths[0])}
    stages = list(dict.fromkeys(e[1] for e in events))
    assert stages.index("dip") < stages.index("em") < stages.index("predictive")
    again = run_batch(paths[:1], tmp_path / "a", TINY_DICT)
    other = run_batch(paths[:1], tmp_path / "b", TINY_DICT)
    assert [o.status for o in first + again + other] == ["done", "skipped", "done"]
    ra, rb = read_result(first[0].output), read_result(other[0].output)
    np.testing.assert_array_equal(ra.reconstruction, rb.reconstruction)
    np.testing.assert_array_equal(ra.std, rb.std)


def test_two_inputs_with_one_output_name(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x.h5").write_bytes(b"x")
    (tmp_path / "b" / "x.npy").write_bytes(b"x")
    with pytest.raises(InputError, match="both be written"):
        plan_outputs([tmp_path / "a" / "x.h5", tmp_path / "b" / "x.npy"], tmp_path)


def _sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def wide(monkeypatch):
    """stderr unwrapped, so that one error is one line."""
    from ctuq.app._cli_output import err_console

    monkeypatch.setattr(err_console, "width", 10_000)


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("how", ["same path", "symlink", "hardlink"])
def test_an_output_that_is_an_input_is_refused_before_any_work(inputs, tmp_path, capsys, wide, how):
    """The output planned for digit0 is (a link to) the user's other sinogram: refused,
    exit 2, naming both, before anything is written; the sinogram keeps its bytes."""
    root, paths = inputs
    out = tmp_path / "out"
    out.mkdir()
    victim = out / "digit0.ctuq.h5"                   # where digit0's result would go
    if how == "same path":                            # a sinogram saved under that name
        shutil.copy(paths[1], victim)
        other = victim
    else:
        other = tmp_path / "elsewhere.h5"
        shutil.copy(paths[1], other)
        (os.symlink if how == "symlink" else os.link)(other, victim)
    before = _sha(other)
    rc = _run([paths[0], other, "--out", out, "--config", root / "tiny.toml", "--overwrite"])
    err = _one_error_line(capsys.readouterr().err)
    assert rc == 2
    assert str(other) in err and "digit0" in err and "overwritten" in err
    assert _sha(other) == before and _sha(victim) == before
    assert sorted(p.name for p in out.iterdir()) == ["digit0.ctuq.h5"]  # nothing else written


def test_summary_json_onto_an_input_is_refused(inputs, tmp_path):
    root, paths = inputs
    before = _sha(paths[0])
    with pytest.raises(InputError, match="summary"):
        run_batch(paths[:1], tmp_path / "out", TINY_DICT, also_writes=[paths[0]])
    assert _sha(paths[0]) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, words", [("missing.h5", "no such file"),
                                         ("nothing/*.nxs", "no file matches"),
                                         ("folder", "is a folder")])
def test_a_missing_input_is_a_usage_error(inputs, tmp_path, capsys, wide, name, words):
    """Not a failed row (exit 1) but one line naming the path, exit 2, before any work."""
    root, paths = inputs
    (tmp_path / "folder").mkdir()
    missing = tmp_path / name
    rc = _run([paths[0], missing, "--out", tmp_path / "out", "--config", root / "tiny.toml"])
    err = _one_error_line(capsys.readouterr().err)
    assert rc == 2
    assert str(missing) in err and words in err
    assert not (tmp_path / "out").exists()             # nothing computed, nothing created


@pytest.mark.slow
def test_resume_after_sigkill(inputs, tmp_path):
    root, paths = inputs
    outdir = tmp_path / "out"
    cmd = [sys.executable, "-m", "ctuq.app.cli", "reconstruct", *map(str, paths),
           "--out", str(outdir), "--config", str(root / "tiny.toml")]
    log = open(tmp_path / "first_run.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 1200  # generous: a loaded 2-core machine is slow
    while time.time() < deadline and not list(outdir.glob("*.ctuq.h5")):
        assert proc.poll() is None, (tmp_path / "first_run.log").read_text()
        time.sleep(0.05)
    time.sleep(0.3)  # let it get into the next input
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = sorted(p.name for p in outdir.glob("*.ctuq.h5"))
    assert 1 <= len(done_before) < 3
    assert subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    names = sorted(p.name for p in outdir.iterdir())
    assert names == sorted(output_path(p, outdir).name for p in paths)  # no temporaries left
    for p in outdir.iterdir():
        read_result(p)  # every output complete


@pytest.mark.slow
def test_dask_local_cluster_matches_serial(inputs, tmp_path):
    root, paths = inputs
    serial = run_batch(paths[:2], tmp_path / "serial", TINY_DICT)  # threads = 1, as workers
    events = []
    dask = run_batch(paths[:2], tmp_path / "dask", TINY_DICT, workers=2,
                     on_progress=lambda *e: events.append(e))
    assert [o.status for o in serial + dask] == ["done"] * 4
    assert any(e[1] == "dip" for e in events)  # worker progress reached the client
    for s, d in zip(serial, dask):
        rs, rd = read_result(s.output), read_result(d.output)
        # the same thread count: the same numbers, bit for bit
        np.testing.assert_array_equal(rd.reconstruction, rs.reconstruction)
        np.testing.assert_array_equal(rd.std, rs.std)
        assert rs.provenance["threads"] == rd.provenance["threads"] == 1
