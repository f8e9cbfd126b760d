"""ctuq.bench.speed and scripts/bench_speed.py: a 16² run of the whole benchmark."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_speed.py"

#: A few iterations: what is timed does not matter here, only that it is recorded.
TINY = {"dip": {"iterations": 4},
        "uncertainty": {"predictive_samples": 4,
                        "laplace": {"em_steps": 1, "n_samples": 2, "preconditioner_rank": 5,
                                    "cg_max_iter": 5}}}


def test_toml_text_round_trips_nested_settings():
    from ctuq.bench.speed import toml_text

    settings = {"seed": 3, "dip": {"iterations": 4, "lr": 0.01},
                "uncertainty": {"model_error": "heldout", "predictive_samples": 4,
                                "laplace": {"em_tol": 0.1, "predcp": False}}}
    assert tomllib.loads(toml_text(settings)) == settings


def test_merge_settings_merges_tables_without_changing_its_inputs():
    from ctuq.bench.speed import merge_settings

    base = {"uncertainty": {"laplace": {"em_tol": 0.02, "em_steps": 3}}, "seed": 1}
    out = merge_settings(base, {"uncertainty": {"laplace": {"em_tol": 0.1}}})
    assert out == {"uncertainty": {"laplace": {"em_tol": 0.1, "em_steps": 3}}, "seed": 1}
    assert base["uncertainty"]["laplace"]["em_tol"] == 0.02


def test_validation_scans_never_name_the_test_split():
    from ctuq.bench.speed import validation_scans

    scans = validation_scans(6)
    assert {s["split"] for s in scans} == {"validation"}
    assert len({(s["family"], s["index"]) for s in scans}) == 6


def test_one_run_reports_the_provenance_stages():
    from ctuq.bench.speed import one_run

    row = one_run(16, TINY, scan={"n_angles": 12}, threads=1)
    sec = row["stages"]["seconds"]
    for stage in ("fbp", "dip", "uncertainty", "em", "predictive", "model_error", "total"):
        assert sec[stage] >= 0, stage
    # the stages make up the total; the ratio is the provenance's own
    assert sum(sec[k] for k in ("fbp", "dip", "uncertainty", "model_error", "consistency",
                                "metrics")) == pytest.approx(sec["total"], rel=0.05)
    assert row["total_over_dip"] == pytest.approx(sec["total"] / sec["dip"])
    assert row["threads"] == 1 and row["stages"]["counts"]["dip_iterations"] == 4
    assert row["case"].startswith("validation/ellipses/0/16/12/")
    assert 0 <= row["coverage_2sigma"] <= 1 and row["mean_std"] > 0


def test_shared_dip_fits_replay_the_recorded_fits(tmp_path):
    """compare --share-dip: a later variant gets the first one's DIP fits, so the same
    settings give the same numbers and the DIP stage is not run again."""
    from ctuq.bench.speed import one_run

    fits = {"path": str(tmp_path / "fits.pt")}
    first = one_run(16, TINY, scan={"n_angles": 12}, threads=1,
                    dip_fits={**fits, "record": True})
    again = one_run(16, TINY, scan={"n_angles": 12}, threads=1,
                    dip_fits={**fits, "record": False})
    assert again["psnr"] == first["psnr"] and again["mean_std"] == first["mean_std"]
    assert again["stages"]["seconds"]["dip"] < first["stages"]["seconds"]["dip"]
    assert first["precond_ranks"] and set(first["precond_ranks"]) == {5}
    fewer = one_run(16, {**TINY, "uncertainty": {**TINY["uncertainty"], "predictive_samples": 2}},
                    scan={"n_angles": 12}, threads=1, dip_fits={**fits, "record": False})
    assert fewer["psnr"] == first["psnr"] and fewer["mean_std"] != first["mean_std"]


@pytest.mark.slow
def test_script_at_16_pixels_gives_one_json_document():
    out = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "16", "--settings",
                          json.dumps(TINY), "--demo-size", "16", "--demo-angles", "12"],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=1800)
    doc = json.loads(out.stdout)
    (row,) = doc["sizes"]
    assert row["size"] == 16 and row["settings"] == TINY
    assert row["stages"]["seconds"]["dip"] > 0 and row["total_over_dip"] > 1
    assert doc["demo"]["wall_s"] > 0 and doc["demo"]["size"] == 16
    sb = doc["side_by_side"]
    assert len(sb["together"]) == 2
    assert sb["slowdown"] == pytest.approx(max(r["wall_s"] for r in sb["together"])
                                           / sb["alone"]["wall_s"])
    assert doc["machine"]["cpu_count"] >= 1 and isinstance(doc["quiet"], bool)
    assert len(doc["load_start"]) == 3
    # how fast the machine ran, before the first run and after the last
    assert set(doc["speed_probe"]) == {"start", "end"}
    assert all(p["conv_ms"] > 0 and p["matmul_gflops"] > 0 for p in doc["speed_probe"].values())


def test_device_run_is_judged_by_the_gpu_targets_and_skips_what_was_not_asked(monkeypatch):
    import ctuq.bench.speed as speed

    seen = []

    def fake(spec):  # the child process's record, without running a reconstruction
        seen.append(spec)
        return {"wall_s": 50.0, "total_over_dip": 2.0, "load_before": [0.1] * 3,
                "load_after": [0.1] * 3, "size": spec["args"]["size"]}

    monkeypatch.setattr(speed, "in_process", fake)
    doc = speed.speed_benchmark([256, 512], settings={"dip": {"iterations": 4}},
                                device="cpu", demo=False, side=False)
    # "cpu" named explicitly: the CPU targets (none at 256²), the device in every run
    assert [r["within_target"] for r in doc["sizes"]] == [None, True]
    assert all(s["args"]["settings"] == {"dip": {"iterations": 4}, "device": "cpu"}
               for s in seen)
    assert "side_by_side" not in doc and "demo" not in doc
    import ctuq.bench.machine as machine_mod
    monkeypatch.setattr(machine_mod, "machine", lambda device="cpu": {"device": str(device)})
    doc = speed.speed_benchmark([256, 512], device="cuda", demo=False, side=False)
    assert doc["targets_s"]["256"] == speed.TARGETS_GPU_S[256]
    assert [r["within_target"] for r in doc["sizes"]] == [True, True]  # 50 s ≤ 60 s, ≤ 300 s
    assert doc["machine"]["device"] == "cuda"


def test_others_cpu_is_the_machines_busy_time_less_our_own(monkeypatch):
    import ctuq.bench.speed as speed

    clock = iter([10.0, 12.0])          # 2 s of wall time
    busy = iter([100.0, 105.0])         # the machine: 5 CPU seconds busy
    own = iter([7.0, 10.0])             # we and our children: 3 of them
    monkeypatch.setattr(speed.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(speed, "_busy_cpu_s", lambda: next(busy))
    monkeypatch.setattr(speed, "_own_cpu_s", lambda: next(own))
    with speed._OthersCPU() as others:
        pass
    assert others.cores == pytest.approx(1.0)  # (5 − 3) / 2


def test_own_cpu_counts_a_finished_child():
    from ctuq.bench.speed import _busy_cpu_s, _own_cpu_s

    before = _own_cpu_s()
    subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\n"
                    "while time.process_time()-t<0.5: pass"], check=True)
    assert _own_cpu_s() - before >= 0.45
    busy = _busy_cpu_s()
    assert busy is None or busy > 0


def test_the_refinement_certificates_reach_the_provenance():
    """``cg_refine`` with ``cg_refine_stages = 'predictive'``: the stage record says how far
    the predictive draws (the std) are certified, and that the EM's solves were not
    refined; without refinement there is no certificate."""
    from ctuq.bench.speed import merge_settings, one_run

    refined = merge_settings(TINY, {"uncertainty": {"laplace": {
        "cg_refine": 2, "cg_refine_stages": "predictive", "cg_max_iter": 200}}})
    cert = one_run(16, refined, scan={"n_angles": 12}, threads=1)["stages"]["certificates"]
    assert cert["em"] is None and 0 <= cert["predictive"] <= 0.1
    plain = one_run(16, TINY, scan={"n_angles": 12}, threads=1)["stages"]
    assert "certificates" not in plain


def test_the_64_preset_refines_its_predictive_draws_by_default():
    """``dip-64`` refines the predictive draws, not the EM's solves, without being asked
    (16² above, on ``reference-28``, it does not)."""
    from ctuq.bench.speed import one_run

    cert = one_run(64, TINY, scan={"n_angles": 12}, threads=1)["stages"]["certificates"]
    assert cert["em"] is None and cert["predictive"] is not None
