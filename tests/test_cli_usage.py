"""The command line as a Unix tool (issue 22 item 3): usage errors exit 2 with one
or two lines naming the option and no traceback; failures keep their whole
reason; resume compares the settings; text from files is printed verbatim."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from ctuq.app.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = """
preset = "reference-28"
threads = 1
[dip]
iterations = 20
[uncertainty]
em_steps = 1
n_samples = 2
predictive_samples = 4
stored_samples = 0
predcp = false
preconditioner_rank = 8
cg_max_iter = 30
"""


def run_cli(*args, cwd=None):
    """The real ``ctuq`` in a fresh process: (exit code, stdout, stderr)."""
    env = {**os.environ, "COLUMNS": "100"}
    p = subprocess.run([sys.executable, "-m", "ctuq.app.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    assert main(["simulate", str(root / "a.h5"), "--phantom", "digits", "--size", "28",
                 "--angles", "20"]) == 0
    (root / "tiny.toml").write_text(TINY)
    return root


USAGE_ERRORS = [
    ([], "no command"),
    (["reconstruct", "--out", "x"], "FILE"),
    (["reconstruct", "a.h5"], "--out"),
    (["nosuchcommand"], "nosuchcommand"),
    (["reconstruct", "a.h5", "--out", "x", "--bogus"], "--bogus"),
    (["reconstruct", "a.h5", "--out", "x", "--seed", "abc"], "--seed"),
    (["reconstruct", "a.h5", "--out", "x", "--seed", "-3"], "--seed"),
    (["reconstruct", "a.h5", "--out", "x", "--pixel-size", "-1"], "--pixel-size"),
    (["reconstruct", "a.h5", "--out", "x", "--pixel-size", "nan"], "--pixel-size"),
    (["reconstruct", "a.h5", "--out", "x", "--angles", "0,10,x"], "--angles"),
    (["reconstruct", "a.h5", "--out", "x", "--angle-unit", "gon"], "--angle-unit"),
    (["reconstruct", "a.h5", "--out", "x", "--angle-first", "0"], "--angle-last"),
    (["reconstruct", "a.h5", "--out", "x", "--convention", "matlab"], "--convention"),
    (["reconstruct", "a.h5", "--out", "x", "--device", "tpu"], "--device"),
    (["reconstruct", "a.h5", "--out", "x", "--preset", "huge"], "--preset"),
    (["reconstruct", "a.h5", "--out", "x", "--threads", "0"], "--threads"),
    (["reconstruct", "a.h5", "--out", "x", "--workers", "0"], "--workers"),
    (["reconstruct", "a.h5", "--out", "x", "--image-size", "12x"], "--image-size"),
    (["reconstruct", "a.h5", "--out", "x", "--config", "missing.toml"], "--config"),
    (["simulate", "x.npy"], ".npy"),
    (["simulate", "x.h5", "--size", "2"], "--size"),
    (["simulate", "x.h5", "--phantom", "cat"], "--phantom"),
    (["info"], "path"),
    (["info", "missing.h5"], "missing.h5"),
]


@pytest.mark.parametrize("args, named", USAGE_ERRORS,
                         ids=[" ".join(a) or "(none)" for a, _ in USAGE_ERRORS])
def test_usage_error_exits_2_in_two_lines(tmp_path, args, named):
    rc, out, err = run_cli(*args, cwd=tmp_path)
    assert rc == 2, (out, err)
    assert "Traceback" not in err + out
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert 1 <= len(lines) <= 3, err           # one message (wrapped at most once) + a hint
    assert named.lower() in err.lower(), err
    assert err.startswith("error:"), err
    assert not any(tmp_path.iterdir())       # nothing written


def test_debug_shows_the_traceback(tmp_path):
    rc, _, err = run_cli("--debug", "info", "missing.h5", cwd=tmp_path)
    assert rc == 2 and "Traceback" in err and "missing.h5" in err


def test_bad_toml_values_name_the_key(tmp_path, scan):
    cases = {'iterations = nan': "dip.iterations", 'iterations = "10"': "dip.iterations",
             'lr = true': "dip.lr", 'warmup = -5': "dip.warmup",
             'lr_min_factor = nan': "dip.lr_min_factor"}
    for line, key in cases.items():
        (tmp_path / "c.toml").write_text(f"[dip]\n{line}\n")
        rc, _, err = run_cli("reconstruct", scan / "a.h5", "--out", tmp_path / "o",
                             "--config", tmp_path / "c.toml")
        assert rc == 2 and key in err and "c.toml" in err and "Traceback" not in err, err
    (tmp_path / "u16.toml").write_bytes("seed = 1\n".encode("utf-16"))
    rc, _, err = run_cli("reconstruct", scan / "a.h5", "--out", tmp_path / "o",
                         "--config", tmp_path / "u16.toml")
    assert rc == 2 and "UTF-8" in err and "Traceback" not in err


def test_failure_reason_is_whole_and_in_the_json(tmp_path, scan):
    bad = tmp_path / "broken_input_with_a_long_name.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 200)
    rc, out, err = run_cli("reconstruct", bad, "--out", tmp_path / "o", "--config",
                           scan / "tiny.toml", "--summary-json", tmp_path / "s.json")
    assert rc == 1 and "Traceback" not in out + err
    doc = json.loads((tmp_path / "s.json").read_text())
    reason = doc["outcomes"][0]["error"]
    assert doc["counts"] == {"done": 0, "skipped": 0, "failed": 1}
    assert "corrupt" in reason or "HDF5" in reason
    flat = " ".join(out.split())           # the table wraps; nothing is cut
    assert " ".join(reason.split()) in flat
    assert "…" not in out


def test_resume_with_changed_settings(tmp_path, scan):
    args = ["reconstruct", scan / "a.h5", "--out", tmp_path / "o", "--config",
            scan / "tiny.toml", "--summary-json", "-"]
    rc, out, _ = run_cli(*args)
    assert rc == 0 and '"done": 1' in out
    first = (tmp_path / "o" / "a.ctuq.h5").read_bytes()
    rc, out, _ = run_cli(*args)                                  # same settings: skipped
    assert rc == 0 and '"skipped": 1' in out
    rc, out, err = run_cli(*args, "--seed", "5")                 # changed: refused, kept
    assert rc == 1 and "seed 0 -> 5" in " ".join(out.split()) and "--overwrite" in out
    assert (tmp_path / "o" / "a.ctuq.h5").read_bytes() == first
    rc, out, _ = run_cli(*args, "--preset", "dip-64")
    assert rc == 1 and "preset" in out
    rc, out, _ = run_cli(*args, "--seed", "5", "--overwrite")    # recomputed on request
    assert rc == 0 and '"done": 1' in out
    from ctuq.data.io import read_result

    assert read_result(tmp_path / "o" / "a.ctuq.h5").seed == 5
    # the input changed since: refused
    with h5py.File(scan / "a.h5", "r") as h:
        data = h["entry/instrument/detector/data"][()]
    changed = tmp_path / "in"
    changed.mkdir()
    from ctuq.data.io import read_sinogram, write_sinogram

    s = read_sinogram(scan / "a.h5")
    s.data[0, 0] += 1.0                                          # one value differs
    write_sinogram(changed / "a.h5", s)
    rc, out, _ = run_cli("reconstruct", changed / "a.h5", "--out", tmp_path / "o",
                         "--config", scan / "tiny.toml", "--seed", "5")
    assert rc == 1 and "input file changed" in " ".join(out.split())
    assert data.size


def test_simulate_extension_matches_format(tmp_path):
    rc, _, err = run_cli("simulate", tmp_path / "x.npy", "--size", "16", "--angles", "8")
    assert rc == 2 and not (tmp_path / "x.npy").exists()
    rc, _, _ = run_cli("simulate", tmp_path / "x.npz", "--size", "16", "--angles", "8")
    assert rc == 0
    with np.load(tmp_path / "x.npz") as z:     # a real npz, not HDF5 under another name
        assert set(z.files) >= {"sinogram", "geometry", "ground_truth"}
    from ctuq.data.io import read_sinogram

    s = read_sinogram(tmp_path / "x.npz")
    assert s.ground_truth.shape == (16, 16) and s.geometry.n_angles == 8


def test_text_from_files_is_not_markup(tmp_path):
    """Issue 25 item 5: '[/oops]' in metadata, ':x:' in names, printed as they are."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram

    g = Geometry.parallel(8, 6)
    s = Sinogram(np.ones(g.range_shape, np.float32), g,
                 {"title": "[/oops] [bold]x[/bold] :x:", "phantom": "[red]"})
    path = write_sinogram(tmp_path / "m.nxs", s)
    rc, out, err = run_cli("info", path)
    assert rc == 0, err
    assert "[/oops] [bold]x[/bold] :x:" in out and "[red]" in out and "❌" not in out
    # an HDF5 dataset named with markup, failing in a batch: the summary still prints
    with h5py.File(tmp_path / "weird.h5", "w") as h:
        h["[/x]"] = np.ones(4)           # one dimension: fails, naming the dataset
    rc, out, err = run_cli("reconstruct", tmp_path / "weird.h5", "--out", tmp_path / "o")
    assert rc == 1 and "Traceback" not in out + err and "[/x]" in out


def test_progress_has_a_clock_per_stage():
    import time

    from ctuq.app._cli_output import BatchBars

    bars = BatchBars(1, transient=True)
    bars.on_stage("a.h5", "dip", 1, 10)
    t_dip = bars.progress.tasks[bars.stage].fields["stage_start"]
    time.sleep(0.01)
    bars.on_stage("a.h5", "dip", 2, 10)
    assert bars.progress.tasks[bars.stage].fields["stage_start"] == t_dip   # same stage
    bars.on_stage("a.h5", "em", 1, 3)
    assert bars.progress.tasks[bars.stage].fields["stage_start"] > t_dip    # its own clock


def test_progress_goes_to_a_log_file_as_plain_lines():
    """Redirected stderr gets a line per stage start/end and at most one per interval."""
    import io

    from rich.console import Console

    from ctuq.app._cli_output import BatchBars

    log = io.StringIO()
    bars = BatchBars(1, console=Console(file=log, markup=False, width=200), log_every=3600)
    with bars:
        for i in range(1, 101):
            bars.on_stage("a.h5", "dip", i, 100, f"loss {1 / i:.3g}")
        bars.on_stage("a.h5", "predictive", 1, 3, "step 1")
    lines = [ln for ln in log.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 3, lines  # dip begins, dip ends, em begins: not 101 lines
    assert "a.h5: dip 1/100" in lines[0] and "loss 1" in lines[0]
    assert "a.h5: dip 100/100" in lines[1] and "a.h5: predictive 1/3" in lines[2]
    assert all("\x1b" not in ln for ln in lines)  # no terminal codes in a file


def test_dip_reports_progress_every_iteration():
    """The DIP bar moves on every iteration (it moved every 50: issue 22)."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.recon.dip import DIPConfig, fit_dip

    op = RayTransform(Geometry.parallel(28, 10))
    events = []
    fit_dip(np.ones(op.range_shape, np.float32), op,
            DIPConfig.for_image_size(28, iterations=7, device="cpu"),
            progress=lambda stage, step, total, message="": events.append(step))
    assert events == list(range(1, 8))


@pytest.mark.slow
def test_dask_logs_are_quiet_without_verbose(tmp_path, scan):
    rc, out, err = run_cli("reconstruct", scan / "a.h5", "--out", tmp_path / "o",
                           "--config", scan / "tiny.toml", "--workers", "1")
    assert rc == 0, err
    noisy = [ln for ln in err.splitlines() if "distributed" in ln or "signal" in ln]
    assert not noisy, noisy
