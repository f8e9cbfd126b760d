"""ctuq.bench.scaling and scripts/bench_scaling.py: slopes, and a quick run's times and memory."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_scaling.py"


def _module():
    from ctuq.bench import scaling

    return scaling


def test_slope_recovers_a_power_law():
    mod = _module()
    px = [64**2, 128**2, 256**2, 512**2]
    assert mod.slope(px, [3e-4 * p**1.5 for p in px]) == pytest.approx(1.5)
    assert mod.slope(px, [0.2 * p for p in px]) == pytest.approx(1.0)
    assert mod.slope(px[:1], [1.0]) is None


def test_quick_run_measures_every_stage():
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--sizes", "32"],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=300)
    doc = json.loads(out.stdout)
    row, system = doc["sizes"]  # ctuq's allocator setting, then glibc's default
    assert (row["allocator"], system["allocator"]) == ("ctuq", "system")
    assert system["allocator_setting"] == "unset"   # the baseline child never called it
    ratios = doc["summary"]["speedup_ctuq_over_system"]["32"]
    assert all(np.isfinite(v) and v > 0 for v in ratios.values())
    for key in ("operator_s", "dip_iteration_s", "jacobian_pair_s", "posterior_sample_s",
                "em_step_s", "sketch_s", "fit_posterior_s", "peak_memory_mb"):
        assert np.isfinite(row[key]) and row[key] > 0, key
    assert set(row["memory_mb"]) == set(_module().STAGES)
    assert row["cg_iterations"] == 3          # the fixed amount of work of --quick
    assert row["preset"] and row["parameters"] > 0 and row["backend"] in ("matrix", "astra")
