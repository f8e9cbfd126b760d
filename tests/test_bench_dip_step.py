"""scripts/bench_dip_step.py: a 16² run on the CPU (the plain loop only)."""

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_dip_step.py"


def test_bench_dip_step_prints_one_json_document_with_the_time_per_iteration():
    out = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "16", "--iterations", "12",
                          "--device", "cpu", "--repeats", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["benchmark"] == "bench_dip_step" and doc["machine"]["device"] == "cpu"
    (row,) = doc["sizes"]
    assert row["size"] == 16 and row["iterations"] == 12
    # a difference of two timings (12 and 10 iterations): finite, of either sign on a busy
    # machine; the two fits themselves took time
    assert math.isfinite(row["plain_ms_per_iteration"])
    assert set(row["plain_fit_seconds"]) == {"10", "12"}
    assert all(v > 0 for v in row["plain_fit_seconds"].values())
    assert "graph_ms_per_iteration" not in row  # no graph on the CPU
    flat = row["flat_vs_per_tensor"]
    # the step over two buffers gives torch's per-tensor numbers bit for bit
    assert flat["bit_identical"] is True and flat["steps"] == 12
    assert flat["flat_ms_per_step"] > 0 and flat["per_tensor_ms_per_step"] > 0
    assert flat["speedup"] == flat["per_tensor_ms_per_step"] / flat["flat_ms_per_step"]


def test_bench_dip_step_refuses_too_few_iterations():
    out = subprocess.run([sys.executable, str(SCRIPT), "--iterations", "10", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--iterations must be above 10" in out.stderr
