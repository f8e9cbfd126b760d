import re
from pathlib import Path

from ctuq.app.cli import main


TINY = """
[dip]
iterations = 30
[uncertainty]
em_steps = 1
n_samples = 2
predictive_samples = 8
predcp = false
preconditioner_rank = 16
cg_max_iter = 60
"""


def test_demo_writes_its_figure_and_files(tmp_path: Path, capsys):
    (tmp_path / "tiny.toml").write_text(TINY)
    rc = main(["demo", "--out", str(tmp_path), "--size", "28", "--angles", "20",
               "--config", str(tmp_path / "tiny.toml")])
    assert rc == 0
    for name in ("demo.png", "demo_sinogram.h5", "demo.h5"):
        assert (tmp_path / name).stat().st_size > 0
    captured = capsys.readouterr()
    text = captured.out
    assert "PSNR" in text and "coverage" in text
    # em_steps = 1: the EM stage counts one step (it read "em 0/2", "em 2/2")
    assert re.search(r"demo: em [01]/1 ", captured.err), captured.err
    assert not re.search(r"demo: em \d+/2 ", captured.err), captured.err
    from ctuq.data.io import read_result

    r = read_result(tmp_path / "demo.h5")
    assert r.std.shape == (28, 28) and r.ground_truth is not None and r.em_trace


def test_user_error_is_one_line_and_exit_code_2(tmp_path: Path, capsys):
    rc = main(["demo", "--out", str(tmp_path), "--size", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "size" in err and "Traceback" not in err
    assert not (tmp_path / "demo.png").exists()


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "ctuq" in capsys.readouterr().out


def test_simulate_then_info(tmp_path: Path, capsys):
    out = tmp_path / "s.h5"
    assert main(["simulate", str(out), "--phantom", "ellipses", "--size", "24", "--angles",
                 "12", "--geometry", "fan", "--seed", "3"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fan" in text and "ground truth" in text and "ellipses" in text
    # refuses to replace an existing file without --overwrite
    assert main(["simulate", str(out), "--size", "24"]) == 2
    assert "overwrite" in capsys.readouterr().err


def test_info_on_a_bad_file_is_one_line(tmp_path: Path, capsys):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"garbage")
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.h5" in err and "Traceback" not in err
