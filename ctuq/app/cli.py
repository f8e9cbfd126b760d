"""The ``ctuq`` command line (typer + rich).

Behaves like a Unix tool: a usage error or a bad value exits with status 2
and one or two lines naming the option (no traceback; ``--debug`` shows it);
a failed input of a batch is one row with its whole reason, and the exit
status is 1 when any input failed. Text from files is printed verbatim
(never read as Rich markup or emoji). Geometry and read flags are generated
from the settings dataclasses (:mod:`ctuq.app._cli_options`): the same names
as the TOML sections ``[geometry]`` and ``[read]``, the Python API and
sidecar files.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from ctuq import __version__
from ctuq.app._cli_classify import bench_classify
from ctuq.app._cli_options import with_settings
from ctuq.app._cli_output import (BatchBars, err_console, error_line, kv_table, note,
                                  out_console, result_rows, sinogram_rows, summary_table,
                                  write_summary_json)
from ctuq.errors import CtuqError, InputError

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="ctuq: uncertainty-aware CT reconstruction.")
console = err_console
log = logging.getLogger("ctuq")

_state = {"debug": False, "verbose": False}

#: The demo's default problem, sized so that `ctuq demo` takes <= 3 min on a 2-core CPU.
DEMO_SIZE = 64
DEMO_ANGLES = 60
#: Extensions ``ctuq simulate`` writes, by format.
SIMULATE_FORMATS = {".nxs": "nxtomo", ".nx": "nxtomo", ".h5": "nxtomo", ".hdf5": "nxtomo",
                    ".npz": "npz"}


def _version(value: bool):
    if value:
        print(f"ctuq {__version__}")
        raise typer.Exit()


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details "
                                       "(also Dask's)."),
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    _state["debug"] = debug
    _state["verbose"] = verbose
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", force=True)
    if not verbose:
        for name in ("distributed", "dask", "tornado", "bokeh"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _build_config(config_file, settings: dict | None = None, **flags):
    """The configuration: defaults, then the TOML file, then the flags given."""
    from ctuq.recon.config import ReconstructionConfig

    cfg = ReconstructionConfig.from_toml(config_file) if config_file else ReconstructionConfig()
    changes = {k: v for k, v in flags.items() if v is not None}
    for group, values in (settings or {}).items():
        changes[group] = values
    if not changes:
        return cfg
    try:
        return cfg.merged(changes)
    except InputError as err:  # a flag's value: name the flag
        name = (err.field or "").split(".")[-1]
        raise InputError(err.message, field=f"--{name.replace('_', '-')}" if name else None
                         ) from None


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError("exists and is not a folder", file=out, field="--out")


@app.command()
def demo(out: Path = typer.Option(Path("demo_out"), "--out", help="Output folder."),
         size: int = typer.Option(DEMO_SIZE, help="Image side in pixels."),
         angles: int = typer.Option(DEMO_ANGLES, help="Number of projection angles."),
         noise: float = typer.Option(0.05, help="Noise std relative to mean |A x|."),
         seed: int = typer.Option(0, help="Seed of the noise and of the reconstruction."),
         config: Path = typer.Option(None, "--config", help="TOML settings file.")):
    """Simulate a Shepp–Logan sinogram and reconstruct it with uncertainty.

    Writes demo.h5 (the result file), demo_sinogram.h5 (the input, NXtomo
    with its truth) and demo.png (truth, FBP, reconstruction, the total,
    posterior and model-error std maps, |error|, calibration curve, EM
    trace), and prints the metrics.
    """
    from ctuq.app.figures import result_figure
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import shepp_logan
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.pipeline import reconstruct_file

    cfg = _build_config(config, seed=seed)
    _check_out_dir(out)
    geometry = Geometry.parallel(size, angles)
    truth = shepp_logan(size)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    y, sigma = simulate_sinogram(truth, RayTransform(geometry), noise, seed=seed)
    sino_path = write_sinogram(out / "demo_sinogram.h5", Sinogram(
        y.cpu().numpy(), geometry, ground_truth=truth,
        meta={"phantom": "shepp", "noise_level": noise, "noise_std": sigma, "seed": seed}),
        overwrite=True)
    with BatchBars(1) as bars:
        def progress(stage, step, total, message=""):
            bars.on_stage("demo", stage, step, total, message)

        result = reconstruct_file(sino_path, out / "demo.h5", cfg, overwrite=True,
                                  progress=progress)
    m = result.metrics
    rows = [("PSNR FBP (dB)", f"{m['psnr_fbp']:.2f}"), ("PSNR ctuq (dB)", f"{m['psnr']:.2f}"),
            ("SSIM ctuq", f"{m['ssim']:.3f}"),
            ("test log-likelihood (nats/pixel)", f"{m['pixel_log_likelihood']:.3f}"),
            ("±1σ / ±2σ / ±3σ coverage (%)", " / ".join(
                f"{100 * m[f'coverage_{k}sigma']:.1f}" for k in (1, 2, 3))
             + "   (ideal 68.3 / 95.4 / 99.7)"),
            ("Spearman(std, |error|)", f"{m['spearman_std_abs_error']:.3f}"),
            ("wall time (s)", f"{time.perf_counter() - t0:.1f}")]
    table = Table(title=Text(f"Shepp–Logan {size}², {angles} angles, {noise:.0%} noise"))
    table.add_column("metric")
    table.add_column("value", justify="right")
    for row in rows:
        table.add_row(*row)
    out_console.print(table)
    result_figure(out / "demo.png", result, title=f"ctuq demo: Shepp–Logan {size}²")
    note(f"wrote {out / 'demo.png'}, {out / 'demo.h5'} and {sino_path}")


@app.command()
def simulate(out: Path = typer.Argument(..., help="Output file: NXtomo (.nxs, .h5) or .npz."),
             phantom: str = typer.Option("shepp", help="shepp | ellipses | rectangles | digits"),
             size: int = typer.Option(64, help="Image side in pixels."),
             angles: int = typer.Option(60, help="Number of projection angles."),
             noise: float = typer.Option(0.05, help="Noise std relative to mean |A x|."),
             geometry: str = typer.Option("parallel", help="parallel | fan"),
             seed: int = typer.Option(0, help="Seed of the phantom and the noise."),
             overwrite: bool = typer.Option(False, help="Replace an existing OUT."),
             counts: float = typer.Option(None, "--counts", help="Realistic scan: open-beam "
                                          "photon counts I0 per detector pixel; writes raw "
                                          "frames (projections, flats, darks; NXtomo only), "
                                          "drawn 4x finer with another projector; --noise is "
                                          "not used."),
             upsample: int = typer.Option(None, "--upsample", help="With --counts: fine "
                                          "pixels per pixel along each axis (default 4)."),
             center_error: str = typer.Option(None, "--center-error", help="With --counts: "
                                              "hidden centre-of-rotation error in detector "
                                              "pixels, or 'random' (uniform in ±0.5; the "
                                              "default).")):
    """Simulate a sinogram and write it with its ground truth (NXtomo or .npz)."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram
    from ctuq.data.io.npz_file import write_sinogram_npz
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import PHANTOMS, make_phantom
    from ctuq.data.simulate import simulate_sinogram

    fmt = SIMULATE_FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise InputError(f"extension {out.suffix or '(none)'!r}: ctuq simulate writes NXtomo "
                         "(.nxs, .h5, .hdf5) or NumPy .npz (the truth and the geometry need a "
                         "container; .npy and TIFF cannot hold them)", field="OUT")
    if geometry not in ("parallel", "fan"):
        raise InputError(f"must be 'parallel' or 'fan', got {geometry!r}", field="--geometry")
    if phantom not in PHANTOMS:
        raise InputError(f"must be one of {', '.join(PHANTOMS)}, got {phantom!r}",
                         field="--phantom")
    for name, v, lo in (("--size", size, 4), ("--angles", angles, 1)):
        if v < lo or v > 16384:
            raise InputError(f"must be from {lo} to 16384, got {v}", field=name)
    if not (0 <= noise < 10):
        raise InputError(f"must be from 0 to 10, got {noise}", field="--noise")
    if counts is not None:
        _simulate_counts(out, fmt, phantom, size, angles, geometry, seed, overwrite, counts,
                         4 if upsample is None else upsample,
                         "random" if center_error is None else center_error)
        return
    for name, v in (("--upsample", upsample), ("--center-error", center_error)):
        if v is not None:
            raise InputError("only with --counts (a realistic scan)", field=name)
    geom = (Geometry.parallel if geometry == "parallel" else Geometry.fan)(size, angles)
    truth = make_phantom(phantom, size, seed)
    y, sigma = simulate_sinogram(truth, RayTransform(geom), noise, seed=seed)
    meta = {"phantom": phantom, "noise_level": noise, "seed": seed}
    if sigma > 0:
        meta["noise_std"] = sigma
    sino = Sinogram(y.cpu().numpy(), geom, ground_truth=truth, meta=meta)
    writer = write_sinogram if fmt == "nxtomo" else write_sinogram_npz
    path = writer(out, sino, overwrite=overwrite)
    note(f"wrote {path} ({'NXtomo' if fmt == 'nxtomo' else 'npz'}): {phantom} {size}², "
         f"{geom.n_angles} angles ({geometry} beam), noise std {sigma:.4g}")


def _simulate_counts(out: Path, fmt: str, phantom: str, size: int, angles: int,
                     geometry: str, seed: int, overwrite: bool, counts: float,
                     upsample: int, center_error: str) -> None:
    """``ctuq simulate --counts``: a realistic scan (photon counts, finer grid, hidden centre)."""
    from ctuq.data.realistic import simulate_realistic

    if fmt != "nxtomo":
        raise InputError("--counts writes raw frames with flats and darks: use NXtomo "
                         "(.nxs, .h5, .hdf5)", field="OUT")
    if not (0 < counts <= 1e9):
        raise InputError(f"must be > 0 and at most 1e9 photons, got {counts:g}",
                         field="--counts")
    if not 1 <= upsample <= 16:
        raise InputError(f"must be from 1 to 16, got {upsample}", field="--upsample")
    offset: float | str = center_error.strip().lower()
    if offset != "random":
        try:
            offset = float(offset)
        except ValueError:
            raise InputError(f"must be 'random' or a number of detector pixels, got "
                             f"{center_error!r}", field="--center-error") from None
    try:
        scan = simulate_realistic(phantom, size, angles, I0=counts, upsample=upsample,
                                  center_offset=offset, seed=seed, phantom_seed=seed,
                                  beam=geometry)
    except InputError as exc:  # name the option, not the library's argument
        options = {"I0": "--counts", "center_offset": "--center-error", "upsample": "--upsample"}
        raise InputError(exc.message, file=exc.file,
                         field=options.get(exc.field, exc.field)) from exc
    path = scan.write(out, overwrite=overwrite)
    note(f"wrote {path} (NXtomo, raw frames): {phantom} {size}², {angles} angles ({geometry} "
         f"beam), I0 = {counts:g} counts, {upsample}x finer grid, hidden centre error "
         f"{scan.hidden['center_offset']:+.3f} px (stored with the truth, not in the geometry)")


def _number_list(text: str, kind, option: str) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"must be a comma-separated list of {kind.__name__}s, got {text!r}",
                         field=option) from None
    if not values:
        raise InputError("is empty", field=option)
    return values


@app.command()
def calibrate(out: Path = typer.Option(..., "--out", help="Coefficients file to write (JSON)."),
              size: int = typer.Option(64, help="Image side in pixels (picks the preset)."),
              families: str = typer.Option(
                  None, help="Phantom families of the tuning split, comma-separated (default: "
                  "those of the calibration shipped for the size's preset; 'photos' is the "
                  "textured family)."),
              n: int = typer.Option(2, "--n", help="Images per family and condition."),
              angles: str = typer.Option("30,60", help="Numbers of angles, comma-separated."),
              noise: str = typer.Option("0.01,0.05", help="Noise levels, comma-separated."),
              config: Path = typer.Option(None, "--config", help="TOML settings file (the "
                                          "settings the coefficients are for)."),
              overwrite: bool = typer.Option(False, help="Replace an existing OUT.")):
    """Fit the model-error coefficients on simulated scans of a phantom family.

    Writes a JSON file for [uncertainty] model_error_file (methods
    'calibrated' and 'conformal', and the prior of 'heldout'). Every scan is
    a full reconstruction: 4 families x 1 image x 4 conditions at 64² took
    42 min on one thread of a 2-core CPU.
    """
    from ctuq.data.io import check_output_path
    from ctuq.recon.calibrate import calibrate as run_calibration
    from ctuq.recon.calibrate import default_families

    cfg = _build_config(config)
    fams = ([f.strip() for f in families.split(",") if f.strip()] if families
            else list(default_families(size, cfg)))
    n_angles = _number_list(angles, int, "--angles")
    levels = _number_list(noise, float, "--noise")
    if not 4 <= size <= 4096:
        raise InputError(f"must be from 4 to 4096, got {size}", field="--size")
    if not 1 <= n <= 1000:
        raise InputError(f"must be from 1 to 1000, got {n}", field="--n")
    check_output_path(out, overwrite=overwrite)
    n_scans = len(fams) * n * len(n_angles) * len(levels)
    with BatchBars(n_scans) as bars:
        def progress(stage, step, total, message=""):
            if stage == "calibrate":
                if step > 0:
                    bars.advance()
                return
            bars.on_stage("calibrate", stage, step, total, message)

        coeffs = run_calibration(size, cfg, families=fams, n_per_family=n, angles=n_angles,
                                 noise_levels=levels, progress=progress)
    coeffs.save(out)
    note(f"wrote {out}: t0 {coeffs.t0:.4g}, s1 {coeffs.s1:.4g}, conformal {coeffs.conformal:.4g}"
         f" ({n_scans} scans, preset {coeffs.info['preset']}); use it with "
         f"[uncertainty] model_error = \"calibrated\", model_error_file = \"{out}\"")


@app.command()
@with_settings("geometry", "read")
def info(path: Path = typer.Argument(..., help="A sinogram or result file."),
         config: Path = typer.Option(None, "--config", help="TOML settings file ([geometry], "
                                                            "[read])."),
         settings: dict = None):
    """Summarise a sinogram or result file (read in a child process with a time limit)."""
    from ctuq.data.io import detect_format, read_result, read_sinogram
    from ctuq.data.io.isolated import read_any_isolated

    cfg = _build_config(config, settings)
    ropts = cfg.read_options
    kwargs = {**ropts.reader_kwargs(), **cfg.geometry}
    if ropts.isolate:
        fmt, obj = read_any_isolated(path, timeout=ropts.read_timeout, **kwargs)
    else:
        fmt = detect_format(path)
        obj = read_result(path) if fmt == "result" else read_sinogram(path, **kwargs)
    if fmt == "result":
        rows = result_rows(obj)
    else:
        rows = sinogram_rows(obj)
    kv_table(f"{path} ({'ctuq result' if fmt == 'result' else fmt + ' sinogram'})", rows)


@app.command()
def gui(path: Path = typer.Argument(None, help="A sinogram or result file to open.")):
    """Open napari with the ctuq widget docked (and FILE loaded)."""
    from ctuq.app.gui import run_gui

    run_gui(path)


@app.command()
@with_settings("geometry", "read")
def reconstruct(inputs: list[Path] = typer.Argument(..., help="Sinogram files.",
                                                    metavar="FILE"),
                out: Path = typer.Option(..., "--out", help="Output folder."),
                config: Path = typer.Option(None, "--config", help="TOML settings file."),
                preset: str = typer.Option(None, help="auto | reference-28 | dip-64 | dip-128 | "
                                                      "dip-256 | dip-512"),
                device: str = typer.Option(None, help="auto | cpu | cuda | cuda:N"),
                seed: int = typer.Option(None, help="Seed of every random draw."),
                threads: int = typer.Option(None, help="torch CPU threads per reconstruction "
                                                       "(default: all cores serially, 1 per "
                                                       "Dask worker)."),
                workers: int = typer.Option(None, help="Local Dask worker processes."),
                scheduler: str = typer.Option(None, help="Address of a running Dask scheduler."),
                overwrite: bool = typer.Option(False, help="Recompute existing outputs."),
                preview: bool = typer.Option(False, help="Also write a PNG figure per result."),
                summary_json: Path = typer.Option(None, "--summary-json",
                                                  help="Write the outcomes as JSON ('-': "
                                                       "standard output)."),
                settings: dict = None):
    """Reconstruct sinogram files with uncertainty: one result file each, resumable."""
    from ctuq.app.batch import new_run_id, run_batch

    cfg = _build_config(config, settings, preset=preset, device=device, seed=seed,
                        threads=threads)
    _check_out_dir(out)
    if workers is not None and workers < 1:
        raise InputError(f"must be >= 1, got {workers}", field="--workers")
    run_id = new_run_id()
    with BatchBars(len(inputs)) as bars:
        def on_progress(inp, name, step, total, message=""):
            bars.on_stage(Path(inp).name, name, step, total, message)

        def on_outcome(o):
            bars.advance()
            if preview and o.status == "done":
                _write_preview(o)

        results = run_batch(inputs, out, cfg.to_dict(), overwrite=overwrite, workers=workers,
                            scheduler=scheduler, on_progress=on_progress, on_outcome=on_outcome,
                            run_id=run_id, quiet_dask=not _state["verbose"],
                            also_writes=[summary_json] if summary_json is not None else ())
    summary_table(results)
    if summary_json is not None:
        write_summary_json(summary_json, results, run_id=run_id)
    failed = [o for o in results if o.status == "failed"]
    if failed:
        err_console.print(Text(f"{len(failed)} of {len(results)} inputs failed",
                               style="bold red"))
        raise typer.Exit(1)


def _write_preview(o) -> None:
    """The PNG next to a result; a failure is a note on the row, not the end of the batch."""
    from ctuq.app.figures import result_figure
    from ctuq.data.io import read_result

    png = Path(o.output).with_suffix("").with_suffix(".png")
    try:
        if png.exists() and not png.is_file():
            raise OSError(f"{png} exists and is not a file")
        result_figure(png, read_result(o.output), title=Path(o.input).name)
    except (OSError, CtuqError, ValueError) as err:
        o.note = f"preview not written: {err}"


app.command("bench-classify")(bench_classify)


#: Commands whose work survives Ctrl-C: finished result files are kept and the
#: finished stages of the file in progress are checkpointed.
_RESUMABLE = ("reconstruct",)


def _interrupted_message(args) -> str:
    command = next((a for a in args if not a.startswith("-")), None)
    if command in _RESUMABLE:
        return ("interrupted: run the same command again to resume (finished files are kept; "
                "the file in progress restarts from its last finished stage)")
    return "interrupted"


def _click_exceptions():
    try:  # typer >= 0.17 vendors click as typer._click
        from typer._click import exceptions as e
    except ImportError:  # pragma: no cover - older typer on real click
        from click import exceptions as e
    return e


def main(argv=None) -> int:
    """Console-script entry point.

    Returns
    -------
    int
        0 success; 1 some inputs failed, or an internal error; 2 a usage
        error, a bad value or an unusable file; 130 interrupted.
    """
    e = _click_exceptions()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        # without standalone mode typer returns Exit's code instead of raising it
        rc = app(args=args, standalone_mode=False, prog_name="ctuq")
    except CtuqError as err:
        if debug or _state["debug"]:
            traceback.print_exc()
        error_line(str(err))
        return 2
    except KeyboardInterrupt:
        error_line(_interrupted_message(args), prefix="")
        return 130
    except (typer.Exit, SystemExit) as exc:
        code = int(getattr(exc, "exit_code", getattr(exc, "code", 0)) or 0)
        if code == 130:
            error_line(_interrupted_message(args), prefix="")
        return code
    except typer.Abort:
        error_line("aborted")
        return 1
    except e.NoArgsIsHelpError as exc:
        ctx = getattr(exc, "ctx", None)
        cmds = ", ".join(sorted(getattr(ctx.command, "commands", {}))) if ctx else ""
        error_line(f"no command given{f' (one of: {cmds})' if cmds else ''}")
        note(f"see '{ctx.command_path if ctx else 'ctuq'} --help'")
        return 2
    except e.ClickException as exc:
        if debug:
            traceback.print_exc()
        error_line(exc.format_message())
        ctx = getattr(exc, "ctx", None)
        note(f"see '{ctx.command_path if ctx else 'ctuq'} --help'")
        return int(getattr(exc, "exit_code", 2) or 2)
    except Exception as exc:  # a bug: say so in one line, the traceback with --debug
        if debug or _state["debug"]:
            traceback.print_exc()
        error_line(f"internal error: {type(exc).__name__}: {exc} (run with --debug for the "
                   "traceback and please report it)")
        return 1
    if rc == 130:  # Ctrl-C: typer turns the KeyboardInterrupt into this exit code
        error_line(_interrupted_message(args), prefix="")
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
