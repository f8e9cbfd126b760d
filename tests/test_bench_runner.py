"""scripts/bench_evidence.run_resumable: the resumable case runner of the benchmarks."""

import importlib.util
import json
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _runner():
    spec = importlib.util.spec_from_file_location("bench_evidence", SCRIPTS / "bench_evidence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_resumable


def test_resume_and_complete(tmp_path):
    """Finished cases are read back, not rerun; an incomplete one is completed from its row,
    appended, and wins on the next read-back; results keep the order of the cases."""
    run_resumable = _runner()
    partial = tmp_path / "cases.jsonl"
    cases = [{"id": f"c{i}"} for i in range(3)]
    calls = []

    def run_one(case, previous=None):
        calls.append((case["id"], previous is not None))
        row = dict(previous) if previous else {"id": case["id"], "base": 1}
        if previous is not None:
            row["extra"] = 2
        return row

    first = run_resumable(cases[:2], str(partial), run_one)
    assert [r["id"] for r in first] == ["c0", "c1"] and calls == [("c0", False), ("c1", False)]
    calls.clear()
    again = run_resumable(cases, str(partial), run_one)          # only c2 is new
    assert calls == [("c2", False)] and [r["id"] for r in again] == ["c0", "c1", "c2"]
    calls.clear()
    done = run_resumable(cases, str(partial), run_one, complete=lambda r: "extra" in r)
    assert sorted(calls) == [("c0", True), ("c1", True), ("c2", True)]
    assert all(r["extra"] == 2 and r["base"] == 1 for r in done)
    calls.clear()
    assert run_resumable(cases, str(partial), run_one, complete=lambda r: "extra" in r) == done
    assert calls == []
    assert len(partial.read_text().splitlines()) == 6 and \
        json.loads(partial.read_text().splitlines()[-1])["extra"] == 2
