"""The allocator setting: applied once on glibc, skipped where the user chose, never fatal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctuq.recon import allocator

_SCRIPT = """
import resource, sys
from ctuq.recon import allocator
if sys.argv[1] == "keep":
    print(allocator.keep_freed_memory(), file=sys.stderr)
import torch
torch.set_num_threads(1)
block = 64 * 2**20  # above glibc's largest mmap threshold (32 MiB)
for _ in range(10):  # the heap grows to its steady state in the first few
    torch.ones(block // 4)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    torch.ones(block // 4)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES",
                                                       "CTUQ_KEEP_FREED_MEMORY")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], env=env, check=True,
                         capture_output=True, text=True,
                         cwd=Path(allocator.__file__).parents[2])
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(allocator._glibc() is None, reason="glibc only")
def test_large_blocks_are_reused_without_page_faults():
    # 20 blocks of 64 MiB: 16,384 pages each when glibc maps them anew.
    system, kept = _faults("system"), _faults("keep")
    assert system > 20 * 16_000
    assert kept < system / 20


@pytest.mark.parametrize("environ, why", [
    ({"CTUQ_KEEP_FREED_MEMORY": "0"}, "CTUQ_KEEP_FREED_MEMORY=0"),
    ({"MALLOC_MMAP_MAX_": "0"}, "MALLOC_MMAP_MAX_"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, "GLIBC_TUNABLES"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "jemalloc"),
])
def test_a_users_choice_is_left_alone(monkeypatch, environ, why):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_glibc", lambda: pytest.fail("must not touch malloc"))
    setting = allocator.keep_freed_memory(environ)
    assert setting.startswith("system (") and why in setting
    assert allocator.allocator_setting() == setting
    allocator.give_back_memory()  # nothing to give back: no call into the C library


def test_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert allocator.keep_freed_memory({}) == "system (not glibc)"


def test_the_result_records_the_setting(monkeypatch):
    from ctuq.recon.provenance import provenance

    monkeypatch.setattr(allocator, "_applied", "keep-freed")
    assert provenance(device="cpu", threads=1)["allocator"] == "keep-freed"
