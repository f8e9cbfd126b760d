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


_state = {"debug": False}

#: The demo's default problem, sized so that `ctuq demo` takes <= 3 min on a 2-core CPU.
DEMO_SIZE = 64
DEMO_ANGLES = 60


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details."),
          debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    _state["debug"] = debug
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


@app.command()
def demo(out: Path = typer.Option(Path("demo_out"), "--out", help="Output folder."),
         size: int = typer.Option(DEMO_SIZE, help="Image side in pixels."),
         angles: int = typer.Option(DEMO_ANGLES, help="Number of projection angles."),
         noise: float = typer.Option(0.05, help="Noise std relative to mean |A x|."),
         seed: int = typer.Option(0, help="Seed of the noise and of the reconstruction."),
         config: Path = typer.Option(None, "--config", help="TOML settings file.")):
    """Simulate a Shepp–Logan sinogram and reconstruct it with uncertainty.

    Writes demo.h5 (the result file), demo_sinogram.h5 (the input, NXtomo
    with its truth) and demo.png (truth, FBP, reconstruction, std map,
    |error|, calibration curve, EM trace), and prints the metrics.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ctuq.app.figures import result_figure
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import shepp_logan
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.recon.pipeline import reconstruct_file

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    geometry = Geometry.parallel(size, angles)
    truth = shepp_logan(size)
    y, sigma = simulate_sinogram(truth, RayTransform(geometry), noise, seed=seed)
    sino_path = write_sinogram(out / "demo_sinogram.h5", Sinogram(
        y.cpu().numpy(), geometry, ground_truth=truth,
        meta={"phantom": "shepp", "noise_level": noise, "noise_std": sigma, "seed": seed}),
        overwrite=True)
    cfg = _build_config(config, None, None, seed)
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console) as bars:
        task = bars.add_task("starting", total=1)

        def progress(stage, step, total, message=""):
            bars.update(task, description=f"{stage:10s} {message}"[:60], completed=step,
                        total=max(total, 1))

        result = reconstruct_file(sino_path, out / "demo.h5", cfg, overwrite=True,
                                  progress=progress)
    m = result.metrics
    table = Table(title=f"Shepp–Logan {size}², {angles} angles, {noise:.0%} noise")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [("PSNR FBP (dB)", f"{m['psnr_fbp']:.2f}"), ("PSNR ctuq (dB)", f"{m['psnr']:.2f}"),
            ("SSIM ctuq", f"{m['ssim']:.3f}"),
            ("test log-likelihood (nats/pixel)", f"{m['pixel_log_likelihood']:.3f}"),
            ("±1σ / ±2σ / ±3σ coverage (%)", " / ".join(
                f"{100 * m[f'coverage_{k}sigma']:.1f}" for k in (1, 2, 3))
             + "   (ideal 68.3 / 95.4 / 99.7)"),
            ("Spearman(std, |error|)", f"{m['spearman_std_abs_error']:.3f}"),
            ("wall time (s)", f"{time.perf_counter() - t0:.1f}")]
    for row in rows:
        table.add_row(*row)
    Console().print(table)
    result_figure(out / "demo.png", result, title=f"ctuq demo: Shepp–Logan {size}²")
    console.print(f"wrote {out / 'demo.png'}, {out / 'demo.h5'} and {sino_path}")


@app.command()
def simulate(out: Path = typer.Argument(..., help="Output NXtomo file (.h5)."),
             phantom: str = typer.Option("shepp", help="shepp | ellipses | rectangles | digits"),
             size: int = typer.Option(64, help="Image side in pixels."),
             angles: int = typer.Option(60, help="Number of projection angles."),
             noise: float = typer.Option(0.05, help="Noise std relative to mean |A x|."),
             geometry: str = typer.Option("parallel", help="parallel | fan"),
             seed: int = typer.Option(0, help="Seed of the phantom and the noise."),
             overwrite: bool = typer.Option(False, help="Replace an existing OUT.")):
    """Simulate a sinogram and write it as NXtomo, keeping the ground truth."""
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram, write_sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import make_phantom
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.errors import InputError

    if geometry not in ("parallel", "fan"):
        raise InputError(f"must be 'parallel' or 'fan', got {geometry!r}", field="--geometry")
    geom = (Geometry.parallel if geometry == "parallel" else Geometry.fan)(size, angles)
    truth = make_phantom(phantom, size, seed)
    y, sigma = simulate_sinogram(truth, RayTransform(geom), noise, seed=seed)
    sino = Sinogram(y.cpu().numpy(), geom, ground_truth=truth,
                    meta={"phantom": phantom, "noise_level": noise, "noise_std": sigma,
                          "seed": seed})
    path = write_sinogram(out, sino, overwrite=overwrite)
    console.print(f"wrote {path}: {phantom} {size}², {geom.n_angles} angles "
                  f"({geometry} beam), noise std {sigma:.4g}")


@app.command()
def info(path: Path = typer.Argument(..., help="A sinogram or result file.")):
    """Summarise a sinogram or result file."""
    from ctuq.data.io import detect_format, read_result, read_sinogram

    fmt = detect_format(path)
    table = Table(title=f"{path} ({fmt})", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    if fmt == "result":
        r = read_result(path)
        table.add_row("reconstruction", f"{tuple(r.reconstruction.shape)} float32")
        table.add_row("mean std", f"{float(r.std.mean()):.4g}")
        if r.geometry is not None:
            table.add_row("geometry", repr(r.geometry))
        table.add_row("created", f"{r.created} by ctuq {r.version} on {r.device}")
        table.add_row("input", f"{r.input_path} (sha256 {str(r.input_sha256)[:12]}…)")
        table.add_row("seed", str(r.seed))
        for k, v in r.hyperparameters.items():
            table.add_row(f"hyperparameter {k}", _short(v))
        if r.em_trace:
            table.add_row("EM steps", str(len(r.em_trace)))
        for k, v in r.metrics.items():
            table.add_row(f"metric {k}", _short(v))
    else:
        s = read_sinogram(path)
        table.add_row("sinogram", f"{tuple(s.data.shape)} float32")
        table.add_row("geometry", repr(s.geometry))
        table.add_row("ground truth", "yes" if s.ground_truth is not None else "no")
        for k, v in s.meta.items():
            table.add_row(k, _short(v))
    Console().print(table)


@app.command()
def gui(path: Path = typer.Argument(None, help="A sinogram or result file to open.")):
    """Open napari with the ctuq widget docked (and FILE loaded)."""
    from ctuq.app.gui import run_gui

    run_gui(path)


def _build_config(config_file, preset, device, seed):
    from ctuq.recon.config import ReconstructionConfig

    cfg = ReconstructionConfig.from_toml(config_file) if config_file else ReconstructionConfig()
    changes = {k: v for k, v in (("preset", preset), ("device", device), ("seed", seed))
               if v is not None}
    return cfg.merged(changes) if changes else cfg


@app.command()
def reconstruct(inputs: list[Path] = typer.Argument(..., help="Sinogram files."),
                out: Path = typer.Option(..., "--out", help="Output folder."),
                config: Path = typer.Option(None, "--config", help="TOML settings file."),
                preset: str = typer.Option(None, help="auto | reference-28 | dip-64 | dip-128 | dip-256"),
                device: str = typer.Option(None, help="auto | cpu | cuda"),
                seed: int = typer.Option(None, help="Seed of every random draw."),
                workers: int = typer.Option(None, help="Local Dask worker processes."),
                scheduler: str = typer.Option(None, help="Address of a running Dask scheduler."),
                overwrite: bool = typer.Option(False, help="Recompute complete outputs."),
                preview: bool = typer.Option(False, help="Also write a PNG figure per result.")):
    """Reconstruct sinogram files with uncertainty: one result file each, resumable."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ctuq.app.batch import run_batch

    cfg = _build_config(config, preset, device, seed)
    outcomes = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=False) as bars:
        batch = bars.add_task("inputs", total=len(inputs))
        stage = bars.add_task("stage", total=1, visible=False)

        def on_progress(inp, name, step, total, message=""):
            bars.update(stage, description=f"{Path(inp).name}: {name} {message}"[:70],
                        completed=step, total=max(total, 1), visible=True)

        def on_outcome(o):
            outcomes.append(o)
            bars.advance(batch)
            if preview and o.status == "done":
                from ctuq.app.figures import result_figure
                from ctuq.data.io import read_result

                result_figure(Path(o.output).with_suffix("").with_suffix(".png"),
                              read_result(o.output), title=Path(o.input).name)

        results = run_batch(inputs, out, cfg.to_dict(), overwrite=overwrite, workers=workers,
                            scheduler=scheduler, on_progress=on_progress, on_outcome=on_outcome)
    _summary_table(results)
    failed = [o for o in results if o.status == "failed"]
    if failed:
        console.print(f"[bold red]{len(failed)} of {len(results)} inputs failed[/]")
        raise typer.Exit(1)


@app.command("bench-classify")
def bench_classify(
        dataset: str = typer.Option("digits", help="digits | mnist | fmnist | kmnist"),
        data_dir: Path = typer.Option(None, "--data-dir",
                                      help="Folder with the IDX/NPZ files (MNIST-like sets)."),
        ood_dir: Path = typer.Option(None, "--ood-dir",
                                     help="Folder with the OOD data set (Fashion-MNIST for "
                                          "MNIST, MNIST for Fashion-MNIST)."),
        methods: str = typer.Option("map,lla-sampled,lla-sampled-val,lla-exact,mc-dropout",
                                    help="Comma-separated: map, map-temp, lla-sampled, "
                                         "lla-sampled-val, lla-sampled-probit, "
                                         "lla-last-layer, lla-last-layer-val, lla-exact, "
                                         "lla-exact-val, lla-exact-probit, "
                                         "lla-exact-prior-val, mc-dropout, laplace-torch, "
                                         "laplace-torch-ll, or 'all'. '-val' methods (and "
                                         "map-temp) tune the predictive scale (temperature) "
                                         "on the validation split; lla-exact-prior-val tunes "
                                         "a multiplier of the prior precision there."),
        out: Path = typer.Option(Path("bench_classify_out"), "--out", help="Output folder."),
        model: str = typer.Option("mlp", help="mlp | cnn"),
        prior: str = typer.Option("ard", help="ard (layer-wise) | gprior"),
        seeds: str = typer.Option("0", help="Comma-separated seeds, e.g. 0,1,2,3,4."),
        epochs: int = typer.Option(150, help="MAP training epochs."),
        train_prior_precision: float = typer.Option(
            1.0, "--train-prior-precision",
            help="Prior precision of MAP training (weight decay × N); choose it by "
                 "validation NLL on a new data set (Fashion-MNIST: 10)."),
        n_train: int = typer.Option(None, "--n-train", help="Random training subset size."),
        n_test: int = typer.Option(None, "--n-test", help="Random test subset size."),
        val_fraction: float = typer.Option(0.1, "--val-fraction",
                                           help="Share of the training set held out "
                                                "(seeded, stratified) before training, for "
                                                "the -val methods and map-temp."),
        sto_batch_size: int = typer.Option(
            None, "--sto-batch-size",
            help="Mini-batch (training images) of the sample-then-optimise sampler; "
                 "default: full batch. Faster on large sets (Fashion-MNIST 9k: 1000)."),
        threads: int = typer.Option(1, help="torch CPU threads (the small networks run "
                                            "fastest single-threaded; 0 keeps torch's choice).")):
    """Classification benchmark: MAP, linearised Laplace (sampled / exact), MC dropout.

    Prints method x accuracy / NLL / ECE (15 bins) / Brier / OOD AUROC / mean NLL
    over the rotated test sets (mean ± std over seeds), and writes bench_classify.json,
    reliability.png and rotation.png into OUT.
    """
    import json

    from ctuq.app.classify_figures import save_benchmark_figures
    from ctuq.errors import InputError
    from dataclasses import replace

    from ctuq.classify import bench as classify_bench
    from ctuq.classify.laplace import CLASSIFIER_STO

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"must be comma-separated integers, got {seeds!r}",
                         field="--seeds") from None
    method_list = classify_bench.parse_methods(methods)
    sto = {} if sto_batch_size is None else {
        "sto": replace(CLASSIFIER_STO, batch_size=sto_batch_size)}
    cfg = classify_bench.BenchConfig(model=model, prior=prior, epochs=epochs,
                                     train_prior_precision=train_prior_precision,
                                     val_fraction=val_fraction, **sto)
    if threads > 0:
        import torch

        # thousands of tiny parallel regions: a second thread only adds waiting
        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    with console.status("running") as status:
        def progress(stage, step, total, message=""):
            status.update(f"seed {len(results) + 1}/{len(seed_list)}: {stage} "
                          f"{step}/{total} {message}"[:80])

        for s in seed_list:
            results += classify_bench.run_seeds(dataset, method_list, cfg, [s],
                                                data_dir=data_dir, ood_dir=ood_dir,
                                                n_train=n_train, n_test=n_test,
                                                progress=progress)
    doc = classify_bench.benchmark_document(results)
    doc["wall_seconds"] = time.perf_counter() - t0
    (out / "bench_classify.json").write_text(json.dumps(doc, indent=1))
    agg = doc["aggregate"]
    ds = results[0].dataset
    table = Table(title=f"{dataset}: {ds['n_train']} train / {ds['n_test']} test, OOD "
                        f"{ds['ood']}, {model} ({results[0].num_params} parameters), "
                        f"{len(seed_list)} seed(s)")
    cols = [("acc. %", "accuracy", 100, 1), ("NLL", "nll", 1, 3), ("ECE %", "ece", 100, 1),
            ("Brier", "brier", 1, 3), ("OOD AUROC %", "ood_auroc", 100, 1),
            ("NLL rotated", "rotation_nll", 1, 2), ("time s", "seconds", 1, 1)]
    table.add_column("method", no_wrap=True)
    for head, *_ in cols:
        table.add_column(head, justify="right")
    several = len(seed_list) > 1
    for name, m in agg.items():
        table.add_row(name, *[f"{m[key]['mean'] * sc:.{dg}f}"
                              + (f" ± {m[key]['std'] * sc:.{dg}f}" if several else "")
                              for _, key, sc, dg in cols])
    Console().print(table)
    for name, why in results[0].skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
    save_benchmark_figures(out, classify_bench.pooled_reliability(results),
                           classify_bench.rotation_rows(agg), title=f"{dataset}, {model}")
    console.print(f"wrote {out / 'bench_classify.json'}, {out / 'reliability.png'} and "
                  f"{out / 'rotation.png'}")


def _summary_table(outcomes) -> None:
    table = Table(title="ctuq reconstruct")
    for col in ("file", "status", "time (s)", "PSNR (dB)", "±2σ coverage", "mean std", "note"):
        table.add_column(col, justify="right" if col not in ("file", "status", "note") else "left")
    colours = {"done": "green", "skipped": "cyan", "failed": "red"}
    for o in outcomes:
        m = o.metrics or {}
        psnr, cov = m.get("psnr"), m.get("coverage_2sigma")
        table.add_row(Path(o.input).name, f"[{colours[o.status]}]{o.status}[/]",
                      f"{o.seconds:.1f}" if o.seconds else "",
                      f"{psnr:.2f}" if psnr is not None else "",
                      f"{100 * cov:.1f} %" if cov is not None else "",
                      f"{o.mean_std:.4g}" if o.mean_std is not None else "",
                      o.error or "")
    Console().print(table)


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"[{', '.join(_short(v) for v in value[:6])}, …] ({len(value)})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def main(argv=None) -> int:
    """Console-script entry point: user errors become one line and exit code 2."""
    try:
        # without standalone mode click returns typer.Exit's code instead of raising it
        rc = app(args=argv, standalone_mode=False)
    except CtuqError as err:
        if _state["debug"]:
            console.print_exception()
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
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
