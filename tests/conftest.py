"""Shared fixtures: a private matrix cache, two threads, CUDA detection."""

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
