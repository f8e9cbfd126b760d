"""``ctuq bench-classify``: the classification-benchmark mode on the command line
(registered on the ``ctuq`` app by :mod:`ctuq.app.cli`)."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from ctuq.app._cli_output import err_console as console
from ctuq.app._cli_output import out_console


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
                                         "laplace-torch-ll, laplace-torch-kron, ivon, "
                                         "ivon+lla, ivon+lla-val, or 'all'. '-val' methods "
                                         "(and map-temp) tune the predictive scale "
                                         "(temperature) on the validation split; "
                                         "lla-exact-prior-val tunes a multiplier of the prior "
                                         "precision there. ivon trains a network by IVON "
                                         "(variational) with a Monte-Carlo predictive "
                                         "(--ivon-samples draws); ivon+lla is the sampled "
                                         "LLA around its mean."),
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
        sto_iterations: int = typer.Option(
            None, "--sto-iterations",
            help="Most steps of the sample-then-optimise sampler (default 300; a full "
                 "batch stops earlier at its tolerance, a mini-batch runs them all)."),
        ivon_lr: float = typer.Option(None, "--ivon-lr",
                                      help="IVON's peak learning rate (default: the data "
                                           "set's validated one, 2 on digits, 0.03 on "
                                           "fmnist)."),
        ivon_hess_init: float = typer.Option(None, "--ivon-hess-init",
                                             help="IVON's initial Hessian (default: 10 on "
                                                  "digits, 0.03 on fmnist)."),
        ivon_temperature: float = typer.Option(
            None, "--ivon-temperature",
            help="Temperature T of IVON's likelihood, ess = N/T (default: 1 on digits, "
                 "0.1 on fmnist)."),
        ivon_prior_precision: float = typer.Option(
            None, "--ivon-prior-precision",
            help="Prior precision of IVON's weight prior (default: --train-prior-precision)."),
        ivon_samples: int = typer.Option(None, "--ivon-samples",
                                         help="Weight samples of the ivon predictive "
                                              "(default 64)."),
        threads: int = typer.Option(1, help="torch CPU threads (the small networks run "
                                            "fastest single-threaded; 0 keeps torch's choice).")):
    """Classification benchmark: MAP, linearised Laplace (sampled / exact), MC dropout, IVON.

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
    sto = {k: v for k, v in (("batch_size", sto_batch_size),
                             ("iterations", sto_iterations)) if v is not None}
    ivon = {k: v for k, v in (("ivon_lr", ivon_lr), ("ivon_hess_init", ivon_hess_init),
                              ("ivon_temperature", ivon_temperature),
                              ("ivon_samples", ivon_samples),
                              ("ivon_prior_precision", ivon_prior_precision)) if v is not None}
    cfg = classify_bench.BenchConfig(model=model, prior=prior, epochs=epochs,
                                     train_prior_precision=train_prior_precision,
                                     val_fraction=val_fraction, **ivon,
                                     **({"sto": replace(CLASSIFIER_STO, **sto)} if sto else {}))
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
    out_console.print(table)
    for name, why in results[0].skipped.items():
        console.print(Text.assemble((f"skipped {name}", "yellow"), f": {why}"))
    save_benchmark_figures(out, classify_bench.pooled_reliability(results),
                           classify_bench.rotation_rows(agg), title=f"{dataset}, {model}")
    console.print(f"wrote {out / 'bench_classify.json'}, {out / 'reliability.png'} and "
                  f"{out / 'rotation.png'}")
