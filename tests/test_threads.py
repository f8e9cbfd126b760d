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
