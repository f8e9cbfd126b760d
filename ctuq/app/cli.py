"""The ``ctuq`` command line (typer + rich).

Every error a user can cause ends in one red line naming the file and the
field, and a non-zero exit code; never a traceback.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ctuq import __version__
from ctuq.errors import CtuqError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="ctuq: uncertainty-aware CT reconstruction.")
console = Console(stderr=True)
log = logging.getLogger("ctuq")


def _version(value: bool):
    if value:
        print(f"ctuq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


@app.command()
def demo(out: Path = typer.Option(Path("demo_out"), "--out", help="Output folder."),
         size: int = typer.Option(128, help="Image side in pixels."),
         angles: int = typer.Option(90, help="Number of projection angles."),
         noise: float = typer.Option(0.05, help="Noise std relative to mean |A x|."),
         seed: int = typer.Option(0, help="Noise seed.")):
    """Simulate a Shepp–Logan sinogram and reconstruct it (FBP and TV), with a figure."""
    import numpy as np
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import shepp_logan
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.baselines import fbp_reconstruction, tv_reconstruction

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    geometry = Geometry.parallel(size, angles)
    op = RayTransform(geometry)
    truth = shepp_logan(size)
    y, sigma = simulate_sinogram(truth, op, noise, seed=seed)
    sino = Sinogram(y.cpu().numpy(), geometry,
                    meta={"phantom": "shepp", "noise_level": noise, "noise_std": sigma,
                          "seed": seed}, ground_truth=truth)
    write_sinogram(out / "demo_sinogram.h5", sino, overwrite=True)
    recons = {"FBP": fbp_reconstruction(y, op).cpu().numpy()}
    with console.status("TV reconstruction (PDHG)…"):
        recons["TV"] = tv_reconstruction(y, op, noise_std=sigma).cpu().numpy()
    np.savez(out / "demo_reconstructions.npz", truth=truth, **{k.lower(): v for k, v in recons.items()})

    table = Table(title=f"Shepp–Logan {size}², {angles} angles, {noise:.0%} noise")
    table.add_column("method")
    table.add_column("PSNR (dB)", justify="right")
    table.add_column("SSIM", justify="right")
    for name, img in recons.items():
        table.add_row(name, f"{peak_signal_noise_ratio(truth, img, data_range=1.0):.2f}",
                      f"{structural_similarity(truth, img, data_range=1.0):.3f}")
    Console().print(table)
    _demo_figure(out / "demo.png", truth, recons)
    console.print(f"wrote {out / 'demo.png'}, {out / 'demo_sinogram.h5'} and "
                  f"{out / 'demo_reconstructions.npz'} in {time.perf_counter() - t0:.1f} s")


def _demo_figure(path: Path, truth, recons: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = 1 + 2 * len(recons)
    fig, axes = plt.subplots(1, n, figsize=(3 * n, 3.3))
    axes[0].imshow(truth, cmap="gray", vmin=0, vmax=1)
    axes[0].set_title("truth")
    for k, (name, img) in enumerate(recons.items()):
        axes[1 + k].imshow(img, cmap="gray", vmin=0, vmax=1)
        axes[1 + k].set_title(name)
        axes[1 + len(recons) + k].imshow(abs(img - truth), cmap="magma", vmin=0, vmax=0.3)
        axes[1 + len(recons) + k].set_title(f"|{name} − truth|")
    for ax in axes:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    """Console-script entry point: user errors become one line and exit code 2."""
    try:
        app(args=argv, standalone_mode=False)
    except CtuqError as err:
        console.print(f"[bold red]error:[/] {err}")
        return 2
    except (typer.Exit, SystemExit) as exc:
        return int(getattr(exc, "exit_code", getattr(exc, "code", 0)) or 0)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
