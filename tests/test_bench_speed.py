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
