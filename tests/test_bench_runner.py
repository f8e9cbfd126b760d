"""ctuq.bench.runner: the resumable case runner of the benchmarks, and JSON cleaning."""

import json
import math

import numpy as np
import torch

from ctuq.bench.runner import clean, read_case_file, read_cases, run_resumable


def test_resume_and_complete(tmp_path):
    """Finished cases are read back, not rerun; an incomplete one is completed from its row,
    appended, and wins on the next read-back; results keep the order of the cases."""
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


def test_clean_makes_json_of_tensors_arrays_and_non_finite_floats():
    doc = {1: torch.tensor([1.5, float("nan")]), "a": np.float32(0.25), "b": np.int64(3),
           "c": (math.inf, -math.inf, 2.0), "d": np.arange(2)}
    out = clean(doc)
    assert out == {"1": [1.5, None], "a": 0.25, "b": 3, "c": [None, None, 2.0], "d": [0, 1]}
    assert json.loads(json.dumps(out, allow_nan=False)) == out


def test_a_partial_file_is_read_back_by_id_and_as_a_case_file(tmp_path):
    partial = tmp_path / "cases.jsonl"
    rows = run_resumable([{"id": "a"}, {"id": "b"}], str(partial),
                         lambda c: {"id": c["id"], "v": np.float64(1.0)})
    assert set(read_cases(partial)) == {"a", "b"}
    assert read_case_file(partial) == rows
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"cases": rows}))
    assert read_case_file(doc) == rows
    assert read_cases(tmp_path / "missing.jsonl") == {} and read_cases(None) == {}


def test_score_differences_finds_the_largest_change_per_method():
    from ctuq.bench.report import score_differences

    old = {"cases": [{"id": "a", "methods": {"m": {"x": 1.0, "r": [0.5, 0.6], "n": None},
                                             "gone": {"x": 1.0}}},
                     {"id": "b", "methods": {"m": {"x": 2.0, "r": [0.1, 0.2], "n": None}}}]}
    new = {"cases": [{"id": "a", "methods": {"m": {"x": 1.0, "r": [0.5, 0.9], "n": None}}},
                     {"id": "b", "methods": {"m": {"x": 2.25, "r": [0.1, 0.2], "n": 3.0}}},
                     {"id": "c", "methods": {}}]}
    d = score_differences(old, new)
    m = d["methods"]["m"]
    assert m["max_abs_diff"] == float("inf") and (m["worst_case"], m["worst_score"]) == ("b", "n")
    assert d["only_old"] == ["a:gone"] and d["only_new"] == ["c"] and m["cases"] == 2
    new["cases"][1]["methods"]["m"]["n"] = None
    m = score_differences(old, new)["methods"]["m"]
    assert abs(m["max_abs_diff"] - 0.3) < 1e-12  # 0.9 - 0.6 beats 2.25 - 2.0
    assert (m["worst_case"], m["worst_score"]) == ("a", "r[1]")
    assert score_differences(old, old)["methods"]["m"]["max_abs_diff"] == 0.0
