"""The default thread count shares a busy machine instead of fighting over it."""

import io

import pytest
import torch

from ctuq.recon import provenance


def _loadavg(running):
    return lambda *a, **k: io.StringIO(f"0.00 0.00 0.00 {running}/100 1234\n")


@pytest.mark.parametrize("running, expected", [(1, 8), (3, 6), (9, 1), (40, 1)])
def test_free_cores_counts_other_runnable_processes(monkeypatch, running, expected):
    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("builtins.open", _loadavg(running))
    assert provenance.free_cores(samples=1) == expected


def test_free_cores_reads_all_cores_where_the_count_is_unreadable(monkeypatch):
    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: set(range(4)))

    def broken(*a, **k):
        raise OSError("no /proc")
    monkeypatch.setattr("builtins.open", broken)
    assert provenance.free_cores(samples=1) == 4


def test_torch_threads_default_takes_the_free_cores_and_restores(monkeypatch):
    old = torch.get_num_threads()
    monkeypatch.setattr(provenance, "free_cores", lambda: 1)
    with provenance.torch_threads(None) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == old
    with provenance.torch_threads(1) as n:  # an explicit count is kept as given
        assert n == 1
    assert torch.get_num_threads() == old


def test_free_cores_mid_run_does_not_count_this_process_as_another(monkeypatch):
    monkeypatch.setattr(provenance.os, "sched_getaffinity", lambda pid: set(range(2)))
    monkeypatch.setattr("builtins.open", _loadavg(3))   # 3 running: 2 of them ours, 1 other
    monkeypatch.setattr(provenance, "own_running_threads", lambda: 2)
    assert provenance.free_cores(samples=1, mid_run=True) == 1
    assert provenance.free_cores(samples=1) == 1  # at the start only the reader is ours: 2 others


def test_own_running_threads_counts_at_least_the_caller():
    assert 1 <= provenance.own_running_threads() <= len(__import__("os").listdir("/proc/self/task"))


def test_governor_follows_the_free_cores_down_and_back_up(monkeypatch):
    from ctuq.progress import ProgressEvent

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    free = iter([1, 1, 2, 2])
    monkeypatch.setattr(provenance, "free_cores", lambda *a, **k: next(free))
    seen = []
    try:
        gov = provenance.ThreadGovernor(2, every_s=0.0)
        governed = gov.wrap(lambda stage, step, total, message: seen.append((stage, step)))
        governed(ProgressEvent("dip", 1, 10, ""))
        assert torch.get_num_threads() == 1 and seen == [("dip", 1)]
        assert gov.rebalance() == 1                      # still busy: no change
        assert gov.rebalance() == 2                      # the other run ended
        assert gov.record() == {"threads_range": [1, 2], "thread_changes": 2}
        slow = provenance.ThreadGovernor(2, every_s=3600.0)
        assert slow.rebalance() == 2                     # not yet time to look again
        assert gov.wrap(None)(ProgressEvent("em", 1, 2, "")) is None  # no user callback
    finally:
        torch.set_num_threads(old)


def test_governor_goes_above_a_busy_start_once_the_machine_frees(monkeypatch):
    old = torch.get_num_threads()
    torch.set_num_threads(1)                      # the start found the machine busy
    monkeypatch.setattr(provenance, "free_cores", lambda *a, **k: 4)
    try:
        gov = provenance.ThreadGovernor(2, every_s=0.0)  # torch's count before the run: 2
        assert gov.rebalance() == 2                      # free cores 4, ceiling 2
        assert gov.record() == {"threads_range": [1, 2], "thread_changes": 1}
    finally:
        torch.set_num_threads(old)


def test_an_unpinned_run_records_its_thread_range_and_it_survives_the_file(tmp_path, monkeypatch):
    import ctuq
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import read_result
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import digits
    from ctuq.data.simulate import simulate_sinogram

    op = RayTransform(Geometry.parallel(28, 20))
    y, _ = simulate_sinogram(digits(1)[0], op, 0.05, seed=1)
    # another process busy on every core but one, as soon as the run looks again
    monkeypatch.setattr(provenance, "free_cores", lambda *a, mid_run=False, **k:
                        1 if mid_run else 2)
    monkeypatch.setattr(provenance.ThreadGovernor, "EVERY_S", 0.0)
    old = torch.get_num_threads()
    try:
        res = ctuq.reconstruct(y.numpy(), geometry=op.geometry,
                               config={"preset": "reference-28", "dip": {"iterations": 10},
                                       "uncertainty": {"em_steps": 1, "n_samples": 2,
                                                       "predictive_samples": 4,
                                                       "predcp": False}})
    finally:
        torch.set_num_threads(old)
    prov = res.provenance
    assert prov["threads"] == min(old, 2)
    if prov["threads"] > 1:  # it went down to the one free core
        assert prov["threads_range"] == [1, prov["threads"]] and prov["thread_changes"] >= 1
    res.save(tmp_path / "r.h5")
    back = read_result(tmp_path / "r.h5").provenance
    assert list(back["threads_range"]) == prov["threads_range"]


def test_side_by_side_runs_each_task_on_its_own_threads_and_restores_the_count():
    import threading

    before = torch.get_num_threads()
    seen, barrier = {}, threading.Barrier(2, timeout=30)

    def task(name):
        barrier.wait()  # both tasks are running at the same time
        seen[name] = (torch.get_num_threads(), threading.get_ident())
        return float(torch.ones(64, 64).matmul(torch.ones(64, 1)).sum()), name

    out = provenance.side_by_side([lambda: task("a"), lambda: task("b")], threads=4)
    assert out == [(4096.0, "a"), (4096.0, "b")]  # results in the order given
    assert seen["a"][0] == seen["b"][0] == 2 and seen["a"][1] != seen["b"][1]
    assert torch.get_num_threads() == before

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        provenance.side_by_side([lambda: 1, fails], threads=2)
    assert torch.get_num_threads() == before
