"""Shared fixtures: a private matrix cache, thread counts, the 28² toy problem, CUDA detection."""

import os

import pytest
import torch


def pytest_configure(config):
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True, scope="session")
def _matrix_cache(tmp_path_factory):
    # tests never touch the user's ~/.cache
    os.environ.setdefault("CTUQ_CACHE_DIR", str(tmp_path_factory.mktemp("ctuq-cache")))
    yield


def cuda_available() -> bool:
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (``pytest.mark.usefixtures("one_thread")``).

    Tiny batched products gain nothing from a second thread, and on a busy
    2-core machine two oversubscribed OpenMP threads make them 3–4× slower
    (measured); the previous count is restored afterwards.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def problem():
    """The 28² toy problem of :func:`ctuq.recon.exact.toy_problem` (a module may override)."""
    from ctuq.recon.exact import toy_problem

    return toy_problem()


@pytest.fixture(scope="module")
def lin(problem):
    """The problem's linearisation at its fitted weights."""
    return problem.linearization()
