"""scripts/validate_shared_fit.py: its summary reads paired fits and the seed spread right."""

import json

import numpy as np
import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def script():
    return load_script("validate_shared_fit")


def _row(case, family, seed, ref, shared, seconds=(10.0, 8.0, 5.0)):
    return {"case": f"validation/{family}/0/64/30/{case}", "family": family,
            "condition": f"{case} condition", "seed": seed,
            "psnr": {"reference": ref, "heldout": ref - 1.0, "shared_0.5": shared},
            "seconds": {"reference": seconds[0], "heldout": seconds[1],
                        "shared_0.5": seconds[2]}}


def test_summary_pairs_each_fit_with_its_own_reference(script):
    rows = [_row("a", "digits", 0, 30.0, 31.0), _row("a", "digits", 1, 32.0, 31.5),
            _row("b", "ellipses", 0, 20.0, 23.0), _row("b", "ellipses", 1, 22.0, 22.5)]
    s = script.summary(rows)
    assert s["split"] == "validation"
    every = s["by_condition"]["all"]
    d = np.array([1.0, -0.5, 3.0, 0.5])
    assert every["shared_0.5"]["minus_reference"] == pytest.approx(d.mean())
    assert every["shared_0.5"]["minus_reference_min"] == pytest.approx(-0.5)
    assert every["shared_0.5"]["fits_better"] == 3
    # per scan: digits +0.25 on average, ellipses +1.75: both better
    assert every["shared_0.5"]["scans_better_on_average"] == 2
    # the reference's spread over seeds, per scan (sample sd of two values: |a − b| / √2)
    assert every["reference_seed_sd"] == pytest.approx(np.sqrt(2.0))
    # held-out fit + continuation over the two separate fits: 13 / 18
    assert every["shared_0.5"]["seconds_over_two_fits"] == pytest.approx(13 / 18)
    assert s["by_family"]["digits"]["shared_0.5"]["minus_reference"] == pytest.approx(0.25)


def test_summary_mode_reads_the_rows_file(script, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    out.write_text("\n".join(json.dumps(_row("a", "digits", s, 30.0 + s, 31.0))
                             for s in (0, 1)) + "\n")
    assert script.main(["--out", str(out), "--summary"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by_condition"]["all"]["fits"] == 2
    assert doc["by_condition"]["all"]["shared_0.5"]["minus_reference"] == pytest.approx(0.5)


def test_summary_of_no_rows_is_one_clear_error(script, tmp_path, capsys):
    assert script.main(["--out", str(tmp_path / "none.jsonl"), "--summary"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "none.jsonl" in err
