from pathlib import Path

from ctuq.app.cli import main


def test_demo_writes_its_figure_and_files(tmp_path: Path, capsys):
    rc = main(["demo", "--out", str(tmp_path), "--size", "32", "--angles", "20"])
    assert rc == 0
    for name in ("demo.png", "demo_sinogram.h5", "demo_reconstructions.npz"):
        assert (tmp_path / name).stat().st_size > 0
    assert "PSNR" in capsys.readouterr().out


def test_user_error_is_one_line_and_exit_code_2(tmp_path: Path, capsys):
    rc = main(["demo", "--out", str(tmp_path), "--size", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "size" in err and "Traceback" not in err
    assert not (tmp_path / "demo.png").exists()


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "ctuq" in capsys.readouterr().out
