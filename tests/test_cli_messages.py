"""What a new user reads: Ctrl-C, the progress line at 80 columns, stage counts,
"did you mean", a transposed sinogram, ``dir(ctuq)``, ``--help`` at 80 columns."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from ctuq.app.cli import main

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_ctrl_c_says_the_run_can_be_resumed(tmp_path, monkeypatch, capsys, wide):
    import ctuq.app.batch as batch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(batch, "run_batch", interrupted)
    np.save(tmp_path / "s.npy", np.ones((4, 9), np.float32))
    rc = main(["reconstruct", str(tmp_path / "s.npy"), "--out", str(tmp_path / "o"),
               "--n-angles", "4"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 130
    assert "interrupted: run the same command again to resume" in err, err


def _render_bars(events, width_env="80"):
    from rich.console import Console

    from ctuq.app._cli_output import BatchBars

    buf = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width_env
    try:
        console = Console(file=buf, force_terminal=True, color_system=None)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    assert console.width == int(width_env)
    with BatchBars(12, console=console) as bars:
        for e in events:
            bars.on_stage(*e)
        bars.progress.refresh()
    lines = [ANSI.sub("", part) for line in buf.getvalue().split("\n")
             for part in line.split("\r")]
    return [ln for ln in lines if ln.strip()]


def test_progress_line_fits_80_columns():
    label = "scan_0001_with_a_long_descriptive_name.nxs"
    lines = _render_bars([(label, "dip", 1234, 5000,
                           "loss 1086.2 (data 1084.3, TV 16.076); best 1060.6 at 15")])
    assert all(len(ln) <= 80 for ln in lines), lines
    stage = [ln for ln in lines if ln.startswith(label[:10])][-1]
    assert "1234/5000" in stage and re.search(r"\d+\.\d s\s*$", stage), stage
    assert "…" in stage   # the description gives way, not the counter


def test_em_counts_match_em_steps():
    """em_steps = 1: the fit makes one EM step and a last E-step; read as em 0/1, 1/1."""
    from ctuq.app._cli_output import stage_counts

    events = [(0, 2, "E-step 0: CG iteration 3"), (1, 2, "EM step 0: γ̂=1"),
              (1, 2, "E-step 1: CG iteration 5"), (2, 2, "EM step 1: γ̂=2")]
    shown = [stage_counts("em", *e) for e in events]
    assert [(s, t) for s, t, _ in shown] == [(0, 1), (1, 1), (1, 1), (1, 1)]
    assert [m.split(":")[0] for *_, m in shown] == ["E-step 1", "EM step 1", "last E-step",
                                                   "last E-step"]
    assert stage_counts("dip", 3, 20, "x") == (3, 20, "x")


@pytest.fixture
def wide(monkeypatch):
    """Error lines unwrapped (the console is as wide as the longest message)."""
    from ctuq.app import _cli_output

    monkeypatch.setattr(_cli_output.err_console, "width", 1000)


def test_toml_typo_suggests_the_key(tmp_path, capsys, wide):
    np.save(tmp_path / "s.npy", np.ones((4, 9), np.float32))
    (tmp_path / "c.toml").write_text("[dip]\nitrations = 3\n")
    assert main(["info", str(tmp_path / "s.npy"), "--config", str(tmp_path / "c.toml")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "c.toml" in err and "dip.itrations" in err and "did you mean 'iterations'?" in err


def test_did_you_mean():
    from ctuq.errors import did_you_mean

    assert did_you_mean("geomtry", ["dip", "geometry", "read"]) == " (did you mean 'geometry'?)"
    assert did_you_mean("n-angles", ["n_angles"]) == " (did you mean 'n_angles'?)"
    assert did_you_mean("colour", ["dip", "geometry"]) == ""


@pytest.mark.parametrize("flags", [["--n-angles", "30"],
                                   ["--angles", ",".join(str(6 * i) for i in range(30))]])
def test_transposed_sinogram_suggests_transposing(tmp_path, capsys, wide, flags):
    np.save(tmp_path / "radon.npy", np.ones((16, 30), np.float32))   # [detector, angle]
    assert main(["info", str(tmp_path / "radon.npy"), *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "transpose" in err.lower() and "--convention skimage" in err, err
    assert main(["info", str(tmp_path / "radon.npy"), *flags, "--convention", "skimage"]) == 0


def test_dir_lists_the_public_api():
    import ctuq

    names = dir(ctuq)
    for name in ("reconstruct", "reconstruct_file", "Result", "Sinogram", "Geometry",
                 "read_sinogram", "read_result", "ReconstructionConfig", "__version__"):
        assert name in names


@pytest.mark.parametrize("command", [[], ["reconstruct"], ["info"], ["demo"]])
def test_help_fits_80_columns(command):
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    p = subprocess.run([sys.executable, "-m", "ctuq.app.cli", *command, "--help"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    too_long = [ln for ln in p.stdout.splitlines() if len(ln) > 80]
    assert not too_long, too_long
    if command == ["reconstruct"]:
        text = " ".join(p.stdout.replace("│", " ").split())
        assert "i*180/N deg, i = 0..N-1" in text   # exactly what --n-angles N means
