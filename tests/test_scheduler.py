"""``ctuq reconstruct --scheduler`` against a real Dask scheduler and workers.

A ``dask scheduler`` and two ``dask worker`` processes (one thread each, no
nanny, loopback only) are started on this machine; a three-file batch is
submitted through the real ``ctuq`` command; one worker is killed (SIGKILL)
while the batch runs. Every result must still be complete and readable, with
no temporaries left, within a bounded time; every process is ended by the
test, whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ctuq.app.batch import output_path
from ctuq.app.cli import main
from ctuq.data.io import read_result

DASK = Path(sys.executable).with_name("dask")
pytestmark = pytest.mark.skipif(not DASK.exists(), reason="the dask command is not installed")

TINY = """
preset = "reference-28"
threads = 1
[dip]
iterations = 60
progress_every = 5
[uncertainty]
em_steps = 1
n_samples = 2
predictive_samples = 4
stored_samples = 2
predcp = false
preconditioner_rank = 8
cg_max_iter = 20
"""
#: Seconds the whole batch may take on a loaded 2-core machine.
BATCH_LIMIT = 600


def _start(args, log: Path, env) -> subprocess.Popen:
    # a session of its own: the process and its children are killed together
    return subprocess.Popen([str(DASK), *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def _wait_for(predicate, timeout: float, what: str, logs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    text = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} within {timeout} s\n{text}")


@pytest.mark.slow  # 25 s idle, up to 2.5 min on a loaded 2-core machine
def test_a_batch_on_a_real_scheduler_survives_a_killed_worker(tmp_path):
    t_start = time.monotonic()
    for seed in range(3):
        assert main(["simulate", str(tmp_path / f"scan{seed}.h5"), "--phantom", "digits",
                     "--size", "28", "--angles", "20", "--seed", str(seed)]) == 0
    inputs = [tmp_path / f"scan{seed}.h5" for seed in range(3)]
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "out"
    sched_file = tmp_path / "scheduler.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start(["scheduler", "--host", "127.0.0.1", "--port", "0",
                             "--no-dashboard", "--scheduler-file", str(sched_file)],
                            tmp_path / "scheduler.log", env))
        logs = [tmp_path / "scheduler.log"]
        _wait_for(lambda: sched_file.exists() and sched_file.stat().st_size > 0, 60,
                  "the scheduler did not write its address", logs)
        address = json.loads(sched_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        for i in range(2):
            logs.append(tmp_path / f"worker{i}.log")
            procs.append(_start(["worker", "--scheduler-file", str(sched_file), "--nthreads",
                                 "1", "--no-nanny", "--host", "127.0.0.1", "--no-dashboard",
                                 "--name", f"w{i}"], logs[-1], env))

        from distributed import Client

        def workers():
            with Client(address, timeout=10) as c:
                return {w["name"]: (a, len(c.processing().get(a, ())))
                        for a, w in c.scheduler_info()["workers"].items()}
        _wait_for(lambda: len(workers()) == 2, 90, "two workers did not join", logs)

        cmd = [sys.executable, "-m", "ctuq.app.cli", "reconstruct", *map(str, inputs),
               "--out", str(out), "--config", str(tmp_path / "tiny.toml"),
               "--scheduler", address, "--summary-json", str(tmp_path / "summary.json")]
        batch_log = tmp_path / "batch.log"
        batch = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, text=True, start_new_session=True)
        procs.append(batch)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(batch.stdout), daemon=True)
        reader.start()
        # the workers are fitting (progress of the DIP stage reached the client): kill one
        _wait_for(lambda: any(": dip " in ln for ln in lines) or batch.poll() is not None,
                  BATCH_LIMIT, "no DIP progress from the workers")
        assert batch.poll() is None, "".join(lines)
        assert workers()["w0"][1] >= 1            # the worker to be killed holds a task
        killed = procs[1]
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        t_kill = time.monotonic()
        try:
            rc = batch.wait(timeout=BATCH_LIMIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the batch did not finish in {BATCH_LIMIT} s after the "
                                 "kill:\n" + "".join(lines)) from None
        reader.join(timeout=10)
        batch_log.write_text("".join(lines))
        assert rc == 0, "".join(lines)[-4000:]
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["counts"] == {"done": 3, "skipped": 0, "failed": 0}
        # every result complete and readable, and nothing else in the folder
        names = sorted(p.name for p in out.iterdir())
        assert names == sorted(output_path(p, out).name for p in inputs), names
        for p in inputs:
            r = read_result(output_path(p, out))
            assert r.reconstruction.shape == (28, 28) and (r.std > 0).all()
            assert r.provenance["threads"] == 1
        print(f"batch of 3 on a real scheduler: {time.monotonic() - t_start:.0f} s in all, "
              f"{time.monotonic() - t_kill:.0f} s after the kill")
    finally:
        for p in reversed(procs):
            _kill(p)


def test_an_unreachable_scheduler_is_one_quick_usage_error(tmp_path, capsys):
    """Nothing listening there: exit 2, one error naming --scheduler, in seconds, and no
    output folder made."""
    import socket

    with socket.socket() as s:                 # a free port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "a.npy").write_bytes(b"\x93NUMPY")
    for address, words in ((f"tcp://127.0.0.1:{port}", "cannot reach"),
                           ("nonsense", "not a Dask scheduler address")):
        t0 = time.monotonic()
        rc = main(["reconstruct", str(tmp_path / "a.npy"), "--out", str(tmp_path / "out"),
                   "--scheduler", address])
        err = " ".join(capsys.readouterr().err.split())
        assert rc == 2 and "--scheduler" in err and words in err, err
        assert "Traceback" not in err and "internal error" not in err
        assert time.monotonic() - t0 < 10
        assert not (tmp_path / "out").exists()
