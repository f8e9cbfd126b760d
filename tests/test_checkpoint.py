"""Stage checkpoints: a stopped reconstruction resumes where it stopped, with the same result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ctuq
from ctuq.data.geometry import Geometry
from ctuq.data.io import read_result, write_sinogram
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import Cancelled, InputError
from ctuq.recon import checkpoint
from ctuq.recon.checkpoint import StageCheckpoints
from ctuq.recon.pipeline import checkpoint_folder, reconstruct_file

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(**dip):
    return ctuq.ReconstructionConfig(
        preset="reference-28", threads=1, dip={"iterations": 40, **dip},
        uncertainty={"em_steps": 1, "n_samples": 2, "predictive_samples": 4,
                     "stored_samples": 0, "predcp": False, "preconditioner_rank": 8,
                     "cg_max_iter": 40, "model_error": "none"})


@pytest.fixture(scope="module")
def scan_file(tmp_path_factory):
    g = Geometry.parallel(28, n_angles=20)
    truth = digits(1)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g), 0.05, seed=2)
    path = tmp_path_factory.mktemp("ck") / "scan.h5"
    write_sinogram(path, ctuq.Sinogram(y.numpy(), g, {"noise_std": sigma}, ground_truth=truth))
    return path


@pytest.fixture(scope="module")
def uninterrupted(scan_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "r.h5"
    reconstruct_file(scan_file, out, _config())
    return read_result(out)


def _stop_at(scan_file, out, stage):
    """Run until the first event of ``stage``, then stop as a cancel would."""
    def progress(ev):
        if ev.stage == stage:
            raise Cancelled("stopped by the test")

    with pytest.raises(Cancelled):
        reconstruct_file(scan_file, out, _config(), progress=progress)
    assert not out.exists()
    return checkpoint_folder(out)


def test_stopped_run_resumes_from_its_finished_stages(scan_file, uninterrupted, tmp_path):
    out = tmp_path / "r.h5"
    folder = _stop_at(scan_file, out, "predictive")
    assert sorted(p.name for p in folder.iterdir()) == ["slice0-dip.pt", "slice0-em.pt"]

    events = []
    reconstruct_file(scan_file, out, _config(),
                     progress=lambda ev: events.append((ev.stage, ev.step)))
    # the DIP and the EM were loaded, not run again
    assert ("dip", 1) in events and not any(s == "dip" and i > 1 for s, i in events)
    assert not any(s == "em" and i > 1 for s, i in events)
    got = read_result(out)
    assert got.config["resumed"] == ["dip", "em"]
    assert uninterrupted.config["resumed"] == []
    np.testing.assert_array_equal(got.reconstruction, uninterrupted.reconstruction)
    assert got.hyperparameters == uninterrupted.hyperparameters
    np.testing.assert_allclose(got.std, uninterrupted.std, rtol=1e-4, atol=1e-6)
    timings = got.config["timings_s"]
    assert timings["total"] >= timings["dip"] + timings["em"]  # saved seconds count
    assert not folder.exists()  # removed once the result was written


def test_other_settings_do_not_resume(scan_file, tmp_path):
    out = tmp_path / "r.h5"
    folder = _stop_at(scan_file, out, "em")
    assert sorted(p.name for p in folder.iterdir()) == ["slice0-dip.pt"]
    reconstruct_file(scan_file, out, _config(iterations=41))
    assert read_result(out).config["resumed"] == []


def test_changed_code_does_not_resume(scan_file, tmp_path, monkeypatch):
    # The version number stays 0.1.0 across commits: the source's hash decides.
    out = tmp_path / "r.h5"
    _stop_at(scan_file, out, "em")
    monkeypatch.setattr(checkpoint, "code_fingerprint", lambda: "edited source")
    reconstruct_file(scan_file, out, _config())
    assert read_result(out).config["resumed"] == []


def test_code_fingerprint_follows_the_source(tmp_path, monkeypatch):
    pkg = tmp_path / "ctuq"
    (pkg / "recon").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(checkpoint, "__file__", str(pkg / "recon" / "checkpoint.py"))
    fingerprint = checkpoint.code_fingerprint.__wrapped__
    before = fingerprint()
    (pkg / "README.txt").write_text("not code")
    assert fingerprint() == before
    (pkg / "a.py").write_text("x = 2\n")
    assert fingerprint() != before


def test_checkpoint_files_ignore_damage_and_keep_user_files(tmp_path):
    ck = StageCheckpoints(tmp_path / "run.resume")
    ck.save(0, "em", "k1", {"a": torch.ones(3)}, seconds=5.0)
    value, seconds = ck.load(0, "em", "k1")
    assert torch.equal(value["a"], torch.ones(3)) and seconds == 5.0
    assert ck.load(0, "em", "k2") is None and ck.load(1, "em", "k1") is None
    (ck.folder / "slice0-dip.pt").write_bytes(b"not a checkpoint")
    assert ck.load(0, "dip", "k1") is None  # damaged: the stage runs again
    with pytest.raises(ValueError):
        ck.save(0, "../fbp", "k1", 1, seconds=0.0)
    (ck.folder / "notes.txt").write_text("mine")
    ck.clear()
    assert sorted(p.name for p in ck.folder.iterdir()) == ["notes.txt"]
    (ck.folder / "notes.txt").unlink()
    ck.clear()
    assert not ck.folder.exists()


def test_folder_name_stays_within_the_file_system_limit(tmp_path):
    short = checkpoint_folder(tmp_path / "scan.ctuq.h5")
    assert short.name == ".scan.ctuq.h5.resume" and short.parent == tmp_path
    long_out = tmp_path / ("x" * 250 + ".h5")
    folder = checkpoint_folder(long_out)
    assert len(folder.name) <= 255 and folder.parent == tmp_path
    assert folder != checkpoint_folder(tmp_path / ("y" * 250 + ".h5"))
    ck = StageCheckpoints(folder)
    ck.save(0, "dip", "k", 1, seconds=1.0)
    assert ck.load(0, "dip", "k") == (1, 1.0)


def test_an_unwritable_folder_costs_only_the_resume(tmp_path):
    blocker = tmp_path / "taken"
    blocker.write_text("a user's file")
    ck = StageCheckpoints(blocker)  # a file where the folder should go
    ck.save(0, "dip", "k", 1, seconds=1.0)  # logged, not raised
    assert ck.load(0, "dip", "k") is None
    ck.clear()
    assert blocker.read_text() == "a user's file"


def test_a_failing_input_leaves_no_resume_folder(tmp_path):
    # 6 angles cannot be split for the held-out term: an InputError after the DIP stage
    # was saved; rerunning fails the same way, so nothing is kept
    g = Geometry.parallel(28, n_angles=6)
    y, sigma = simulate_sinogram(digits(1)[0], RayTransform(g), 0.05, seed=2)
    src = tmp_path / "few.h5"
    write_sinogram(src, ctuq.Sinogram(y.numpy(), g, {"noise_std": sigma}))
    cfg = _config().merged({"uncertainty": {"model_error": "heldout", "heldout_every": 2},
                            "dip": {"iterations": 5}})
    out = tmp_path / "few_recon.h5"
    saved = []
    with pytest.raises(InputError, match="too few"):
        reconstruct_file(src, out, cfg, progress=lambda ev: saved.append(
            checkpoint_folder(out).is_dir()))
    assert any(saved)  # the DIP stage had been saved
    assert not checkpoint_folder(out).exists() and not out.exists()
    # a missing calibration file fails before any fit: no folder either
    bad = _config().merged({"uncertainty": {"model_error": "calibrated",
                                            "model_error_file": str(tmp_path / "no.json")}})
    with pytest.raises(InputError, match="no such model-error file"):
        reconstruct_file(src, out, bad)
    assert not checkpoint_folder(out).exists()


def test_a_cancel_before_any_saved_stage_leaves_no_folder(scan_file, tmp_path):
    out = tmp_path / "r.h5"
    folder = _stop_at(scan_file, out, "dip")
    assert not folder.exists()
