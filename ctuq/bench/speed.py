"""How long a default reconstruction takes, stage by stage, alone and side by side.

:func:`speed_benchmark` (docs/speed.md) times, each in a fresh
process so that nothing (threads, allocator, caches) carries over:

- one default reconstruction per image size (:func:`one_run`) of a
  simulated scan made exactly as the test split's scans are
  (:func:`ctuq.bench.cases.simulate`: parallel beam, 60 angles, 5 % relative
  Gaussian noise), but of the **validation** split (ellipses, image 0), so
  that no test image is looked at; the stage breakdown is the result's own
  ``provenance['stages']`` and the ratio total / DIP fit is taken from it;
- ``ctuq demo`` (:func:`demo_run`, the command line as a user runs it);
- two identical runs launched side by side (two processes at once) against
  one alone (:func:`side_by_side`): each run picks its thread count itself
  (``ctuq.recon.provenance.free_cores``), as two users' runs would.

:func:`compare_settings` runs a few validation scans under named setting
variants and reports seconds per stage, mean std and ±2σ coverage of each
(the evidence behind the speed settings, docs/speed.md).

Timings are only comparable on a quiet machine: every run records
``os.getloadavg()`` before and after it, and ``others_cores``, the CPU time
that *other* processes used while it ran (the machine's busy time from
``/proc/stat`` less the run's own processes'), in cores; the run's own
threads raise the load average, so the load alone cannot tell.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctuq.bench.runner import merge_settings

__all__ = ["SCAN", "SPEED_VARIANTS", "validation_scans", "TARGETS_S", "TARGETS_GPU_S", "one_run", "demo_run", "side_by_side", "compare_settings",
           "speed_benchmark", "toml_text", "child_run", "in_process", "merge_settings", "mc_summary"]

#: The scan of a timed run: an image of the validation split simulated as the
#: test split's scans are (parallel beam, 60 angles, 5 % noise).
SCAN = {"split": "validation", "family": "ellipses", "index": 0, "n_angles": 60,
        "noise": 0.05}

#: Targets per image size (seconds of one default run; ``demo``: ``ctuq demo``).
TARGETS_S = {64: 20.0, 128: 90.0, 512: 1200.0, "demo": 20.0, "total_over_dip": 2.5,
             "side_by_side_over_alone": 2.5}

#: Targets on a GPU (seconds of one default run, end to end).
TARGETS_GPU_S = {256: 60.0, 512: 300.0, "total_over_dip": 2.5}


#: The setting variants :func:`compare_settings` runs by default: the reference
#: (every setting at its old value), each speed setting alone, and all together.
SPEED_VARIANTS: dict[str, dict] = {
    "reference": {},
    "em_tol_0.1_patience_1": {"uncertainty": {"laplace": {"em_tol": 0.1}}},
    "heldout_iterations_0.5": {"uncertainty": {"heldout_iterations": 0.5}},
    "predictive_samples_32": {"uncertainty": {"predictive_samples": 32}},
    "all": {"uncertainty": {"laplace": {"em_tol": 0.1}, "heldout_iterations": 0.5,
                            "predictive_samples": 32}},
    # the held-out fit first (0.7 of the iterations), the fit on all angles continued
    # from it (0.3): one fit's worth of DIP iterations instead of two
    "shared": {"uncertainty": {"laplace": {"em_tol": 0.1}, "heldout_iterations": 0.7,
                               "dip_from_heldout": 0.3, "predictive_samples": 32}},
    # the held-out fit as before (so the same coefficients), the fit on all angles
    # continued from it for 0.3 of the iterations: 1.3 fits' worth instead of 2
    "shared_full": {"uncertainty": {"dip_from_heldout": 0.3, "predictive_samples": 32}},
    # the same with half the iterations continued
    "shared_full_0.5": {"uncertainty": {"dip_from_heldout": 0.5, "predictive_samples": 32}},
}


def validation_scans(n: int, n_angles: int = 60, noise: float = 0.05) -> list[dict]:
    """``n`` scans of the validation split, one family after the other (image 0, 1, ...)."""
    from ctuq.data.splits import FAMILIES

    fams = FAMILIES["validation"]
    return [{"split": "validation", "family": fams[i % len(fams)], "index": i // len(fams),
             "n_angles": n_angles, "noise": noise} for i in range(int(n))]


#: A run is quiet when other processes used less than this many cores meanwhile.
QUIET_OTHERS_CORES = 0.25


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine spent busy since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:  # pragma: no cover - not Linux
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


class _OthersCPU:
    """Measures the cores other processes used during a ``with`` block.

    ``cores``: (machine busy CPU seconds − this process's and its waited-for
    children's CPU seconds) / wall seconds; None where ``/proc/stat`` is missing.
    """

    def __enter__(self):
        self._t, self._busy, self._own = time.perf_counter(), _busy_cpu_s(), _own_cpu_s()
        self.cores = None
        return self

    def __exit__(self, *exc):
        busy = _busy_cpu_s()
        if busy is not None and self._busy is not None:
            wall = max(time.perf_counter() - self._t, 1e-9)
            self.cores = max(0.0, (busy - self._busy) - (_own_cpu_s() - self._own)) / wall
        return False


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - not available
        return None


def one_run(size: int, settings: dict | None = None, scan: dict | None = None,
            threads: int | None = None, mc: bool = False,
            dip_fits: dict | None = None) -> dict:
    """One reconstruction in this process, timed.

    Parameters
    ----------
    size : int
        Image side (pixels).
    settings : dict, optional
        :class:`~ctuq.recon.config.ReconstructionConfig` overrides (``{"dip":
        {"iterations": 5}}``). Default none: the defaults for the size.
    scan : dict, optional
        ``split``, ``family``, ``index``, ``n_angles``, ``noise``. Default :data:`SCAN`.
    threads : int, optional
        torch threads. Default None: the pipeline's choice (the free cores).
    mc : bool
        Keep every predictive sample in the result (storage only: the same
        numbers are computed) and add :func:`mc_summary` (the Monte-Carlo
        error of the mean std, and the std from the first half of the
        samples). Default False.
    dip_fits : dict, optional
        ``{"path": ..., "record": bool}``: save this run's DIP fits to
        ``path`` (``record``) or take them from there instead of fitting
        (:class:`_SharedDIPFits`; ``compare_settings(share_dip=True)``).

    Returns
    -------
    dict
        ``wall_s`` (the ``ctuq.reconstruct`` call), ``stages`` (the
        provenance's seconds and counts), ``total_over_dip``, ``threads``,
        ``mean_std``, ``mean_posterior_std``, ``coverage_2sigma``,
        ``coverage_1sigma``, ``psnr``,
        ``em_steps``, ``load_before`` / ``load_after``.
    """
    import numpy as np

    import ctuq
    from ctuq.bench.cases import _case, simulate, sinogram

    sc = {**SCAN, **(scan or {})}
    case = _case(sc["split"], sc["family"], int(sc["index"]), int(size), int(sc["n_angles"]),
                 float(sc["noise"]))
    data = sinogram(simulate(case))
    given = settings or {}
    if mc:  # keep every sample: storage only, the std is computed from the same draws
        given = merge_settings(given, {"uncertainty": {"stored_samples": 100_000}})
    cfg = ctuq.ReconstructionConfig.from_dict({**given,
                                               **({"threads": threads} if threads else {})})
    cuda = str(cfg.device).startswith("cuda")
    if cuda:
        import torch
        torch.cuda.reset_peak_memory_stats()
    load_before = _load()
    t0 = time.perf_counter()
    with _SharedDIPFits(**dip_fits) if dip_fits else contextlib.nullcontext():
        res = ctuq.reconstruct(data, cfg)
    wall = time.perf_counter() - t0
    gpu = {}
    if cuda:
        gpu = {"gpu": torch.cuda.get_device_name(),
               "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated() / 1024**3}
    stages = res.provenance["stages"]
    sec = stages["seconds"]
    m = res.metrics
    return {"case": case["id"], "size": int(size), "settings": settings or {},
            "wall_s": wall, "stages": stages,
            "total_over_dip": _total_over_dip(sec),
            "threads": res.provenance.get("threads"),
            "threads_range": res.provenance.get("threads_range"),
            "mean_std": float(np.mean(res.std)),
            "mean_posterior_std": float(np.mean(res.posterior_std)),
            "mean_model_error_std": float(np.mean(res.model_error_std)),
            "coverage_2sigma": float(m["coverage_2sigma"]), "psnr": float(m["psnr"]),
            "coverage_1sigma": float(m["coverage_1sigma"]) if "coverage_1sigma" in m else None,
            "em_steps": (res.hyperparameters or {}).get("em_steps"),
            "precond_ranks": [t.get("precond_rank") for t in res.em_trace],
            "solver_iterations": [t.get("solver_iterations") for t in res.em_trace],
            "load_before": load_before, "load_after": _load(), **gpu,
            **({"mc": mc_summary(res)} if mc else {})}


def _total_over_dip(seconds: dict) -> float | None:
    """Total time over one full DIP fit's: the ``dip`` stage's, or, where the fit
    on all angles continued from the held-out fit or ran beside it, the held-out
    fit's (a whole schedule; the ``dip`` stage then holds both)."""
    one_fit = seconds.get("dip_heldout") or seconds.get("dip")
    return seconds["total"] / one_fit if one_fit else None


def mc_summary(res, batches: int = 8) -> dict:
    """The Monte-Carlo error of a result's mean std, from its stored predictive samples.

    The per-pixel posterior variance is the mean of the squared zero-mean
    samples; the model-error variance is held fixed. The standard error of
    the mean (total and posterior) std is the jackknife over ``batches``
    groups of samples. ``first_half``: the mean std and ±2σ coverage from
    the first half of the samples alone, i.e. what ``predictive_samples``
    halved draws (its draws are the same first ones; the held-out fit
    then sees this run's posterior variance, a second-order difference).
    """
    import numpy as np

    fl = np.asarray(res.samples, np.float64) - np.asarray(res.reconstruction, np.float64)
    me = np.asarray(res.model_error_std, np.float64) ** 2
    k = fl.shape[0]
    groups = np.array_split(np.arange(k), min(batches, k))

    def means(idx):
        vp = (fl[idx] ** 2).mean(0)
        return float(np.sqrt(vp + me).mean()), float(np.sqrt(vp).mean())

    full = means(np.arange(k))
    jack = np.array([means(np.setdiff1d(np.arange(k), g)) for g in groups])
    g = len(groups)
    se = np.sqrt((g - 1) / g * ((jack - jack.mean(0)) ** 2).sum(0))
    half = np.arange(k // 2)
    std_half = np.sqrt((fl[half] ** 2).mean(0) + me)
    out = {"samples": int(k), "mean_std": full[0], "mean_std_se": float(se[0]),
           "mean_posterior_std": full[1], "mean_posterior_std_se": float(se[1])}
    truth = res.ground_truth
    if truth is not None:
        err = np.abs(np.asarray(truth, np.float64) - np.asarray(res.reconstruction, np.float64))
        out["first_half"] = {"samples": int(len(half)), "mean_std": float(std_half.mean()),
                             "coverage_2sigma": float((err <= 2 * std_half).mean())}
        out["coverage_2sigma_recomputed"] = float(
            (err <= 2 * np.sqrt((fl ** 2).mean(0) + me)).mean())
    return out


def child_run(spec: dict) -> dict:
    """:func:`one_run` (``kind == 'run'``) or :func:`demo_run` from a JSON-able spec."""
    if spec.get("kind") == "demo":
        return demo_run(**spec.get("args", {}))
    return one_run(**spec.get("args", {}))


def _child_cmd(spec: dict) -> list[str]:
    return [sys.executable, "-c", "import json, sys; from ctuq.bench.speed import child_run; "
            "print(json.dumps(child_run(json.loads(sys.argv[1]))))", json.dumps(spec)]


def _start(spec: dict) -> subprocess.Popen:
    return subprocess.Popen(_child_cmd(spec), stdout=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed with exit status {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def in_process(spec: dict) -> dict:
    """:func:`child_run` in a fresh Python process (stderr passes through).

    The record gains ``others_cores`` (:class:`_OthersCPU`).
    """
    with _OthersCPU() as others:
        row = _finish(_start(spec))
    row["others_cores"] = others.cores
    return row


def toml_text(settings: dict) -> str:
    """A TOML file of nested settings (tables of numbers, strings and booleans)."""
    lines: list[str] = []

    def table(prefix: str, values: dict):
        scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
        if prefix and scalars:
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {json.dumps(v)}")
        for k, v in values.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", settings or {})
    return "\n".join(lines) + "\n"


def demo_run(size: int | None = None, angles: int | None = None,
             settings: dict | None = None) -> dict:
    """``ctuq demo`` as a user runs it (a fresh process), timed from start to exit.

    Parameters
    ----------
    size, angles : int, optional
        ``--size`` / ``--angles``. Default the demo's (64², 60 angles).
    settings : dict, optional
        Written to a TOML file given as ``--config``. Default none.
    """
    with tempfile.TemporaryDirectory(prefix="ctuq-speed-") as tmp:
        cmd = [sys.executable, "-m", "ctuq.app.cli", "demo", "--out", str(Path(tmp) / "out")]
        cmd += ["--size", str(size)] if size else []
        cmd += ["--angles", str(angles)] if angles else []
        if settings:
            path = Path(tmp) / "settings.toml"
            path.write_text(toml_text(settings))
            cmd += ["--config", str(path)]
        load_before = _load()
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "size": size, "angles": angles, "settings": settings or {},
            "load_before": load_before, "load_after": _load()}


def side_by_side(size: int, settings: dict | None = None, copies: int = 2) -> dict:
    """``copies`` identical runs started at once (separate processes) against one alone.

    Returns
    -------
    dict
        ``alone`` (:func:`one_run`'s record), ``together`` (one per copy),
        ``slowdown``: the slowest copy's ``wall_s`` over the lone run's.
    """
    spec = {"kind": "run", "args": {"size": size, "settings": settings}}
    alone = in_process(spec)
    with _OthersCPU() as others:
        procs = [_start(spec) for _ in range(copies)]
        together = [_finish(p) for p in procs]
    return {"size": size, "copies": copies, "alone": alone, "together": together,
            "others_cores": others.cores,
            "slowdown": max(r["wall_s"] for r in together) / alone["wall_s"]}


class _SharedDIPFits:
    """``ctuq.recon.dip.fit_dip`` while the block runs: with ``record``, every fit is
    made and the list is saved to ``path`` at the end; otherwise the fits are read
    back from ``path`` in the order they were made (the run's settings of the DIP
    must be those of the recording run)."""

    def __init__(self, path, record: bool):
        self.path, self.record, self.kept = Path(path), bool(record), []

    def __enter__(self):
        import torch

        import ctuq.recon.dip as dip

        self.module, self.fit = dip, dip.fit_dip
        if not self.record:
            self.kept = list(torch.load(self.path, weights_only=False))

        def fit_dip(*args, **kwargs):
            if self.record:
                self.kept.append(self.fit(*args, **kwargs))
                return self.kept[-1]
            return self.kept.pop(0)

        dip.fit_dip = fit_dip
        return self

    def __exit__(self, *exc):
        import torch

        self.module.fit_dip = self.fit
        if self.record and exc[0] is None:
            torch.save(self.kept, self.path)


def compare_settings(variants: dict[str, dict], sizes, cases: list[dict],
                     base: dict | None = None, share_dip: bool = False) -> dict:
    """Seconds per stage, mean std and ±2σ coverage of each setting variant, per scan.

    Parameters
    ----------
    variants : dict
        ``name -> settings overrides`` (merged over ``base``); one should be
        the reference (``{}``).
    sizes : iterable of int
    cases : list of dict
        Scans (``split``, ``family``, ``index``, ``n_angles``, ``noise``);
        the validation split for any choice of settings.
    base : dict, optional
        Settings every variant starts from.
    share_dip : bool
        Fit the DIP (and the held-out fit) of a scan once, in the first
        variant, and hand the later variants copies: for variants of the
        uncertainty stage only (their ``dip`` stage seconds and ``wall_s``
        then leave the fits out). Default False.

    Returns
    -------
    dict
        ``runs``: one row per (size, case, variant) with :func:`one_run`'s
        fields; ``summary[size][variant]``: means over the cases of
        ``wall_s``, ``mean_std``, ``coverage_2sigma``, ``psnr`` and their
        differences to the first variant, and the stage seconds;
        ``speed_probe``: :func:`ctuq.bench.machine.speed_probe` before and after.
    """
    import numpy as np

    from ctuq.bench.machine import speed_probe

    probe = {"start": speed_probe()}
    rows, summary = [], {}
    names = list(variants)
    fits = tempfile.TemporaryDirectory(prefix="ctuq-fits-") if share_dip else None
    for size in sizes:
        per = {name: [] for name in names}
        for sc in cases:
            for name in names:
                args = {"size": int(size), "scan": sc, "mc": True,
                        "settings": merge_settings(base or {}, variants[name])}
                if fits is not None:
                    args["dip_fits"] = {"path": str(Path(fits.name) / "fits.pt"),
                                        "record": name == names[0]}
                row = in_process({"kind": "run", "args": args})
                row["variant"] = name
                rows.append(row)
                per[name].append(row)
                print(f"speed: {size}² {row['case']} {name}: {row['wall_s']:.1f} s, mean std "
                      f"{row['mean_std']:.4g}, coverage {row['coverage_2sigma']:.3f}",
                      file=sys.stderr, flush=True)
        ref = per[names[0]]
        summary[str(size)] = {}
        for name in names:
            rs = per[name]
            stage_names = sorted({k for r in rs for k in r["stages"]["seconds"]})
            summary[str(size)][name] = {
                "wall_s": float(np.mean([r["wall_s"] for r in rs])),
                "seconds_saved": float(np.mean([a["wall_s"] - r["wall_s"]
                                                for a, r in zip(ref, rs)])),
                "stage_seconds": {k: float(np.mean([r["stages"]["seconds"].get(k, 0.0)
                                                    for r in rs])) for k in stage_names},
                "mean_std": float(np.mean([r["mean_std"] for r in rs])),
                "mean_std_relative_change": float(np.mean([
                    r["mean_std"] / a["mean_std"] - 1 for a, r in zip(ref, rs)])),
                "coverage_2sigma": float(np.mean([r["coverage_2sigma"] for r in rs])),
                "coverage_change_points": float(100 * np.mean([
                    r["coverage_2sigma"] - a["coverage_2sigma"] for a, r in zip(ref, rs)])),
                "mean_std_mc_se": float(np.mean([r["mc"]["mean_std_se"] for r in rs])),
                "psnr": float(np.mean([r["psnr"] for r in rs])),
                "psnr_change_db": float(np.mean([r["psnr"] - a["psnr"] for a, r in zip(ref, rs)])),
                "psnr_change_db_range": [float(f(r["psnr"] - a["psnr"] for a, r in zip(ref, rs)))
                                         for f in (min, max)],
                "em_steps": [r["em_steps"] for r in rs]}
    if fits is not None:
        fits.cleanup()
    probe["end"] = speed_probe()
    return {"variants": variants, "base": base or {}, "cases": cases, "runs": rows,
            "summary": summary, "share_dip": bool(share_dip), "speed_probe": probe}


def speed_benchmark(sizes=(64, 128), *, settings: dict | None = None, demo: bool = True,
                    demo_args: dict | None = None, side_size: int | None = None,
                    device: str | None = None, side: bool = True) -> dict:
    """The speed benchmark's document (docs/speed.md).

    Parameters
    ----------
    sizes : iterable of int
        One default run per size (512 only when asked: ≈ 20 min on 2 cores).
    settings : dict, optional
        Overrides for every run (a test's few iterations; none for the benchmark).
    demo : bool
        Time ``ctuq demo`` too. Default True.
    demo_args : dict, optional
        :func:`demo_run`'s ``size``/``angles`` (default the demo's own).
    side_size : int, optional
        Image side of the side-by-side check. Default the first size.
    device : str, optional
        ``'cuda'``: every run on the GPU, judged by :data:`TARGETS_GPU_S`, the
        card and its peak memory recorded. Default None (the settings' device,
        i.e. the CPU targets).
    side : bool
        Run the side-by-side check. Default True.

    Returns
    -------
    dict
        ``machine``, ``scan``, ``targets_s``, ``sizes`` (one :func:`one_run`
        record each, with ``within_target``), ``demo``, ``side_by_side``,
        ``load_start`` / ``load_end``, ``speed_probe`` (``start`` and ``end``:
        :func:`ctuq.bench.machine.speed_probe`, how fast the machine ran) and
        ``quiet`` (other processes used
        less than :data:`QUIET_OTHERS_CORES` cores during every run, each
        run's ``others_cores``; without ``/proc/stat``, the 1-minute load
        stayed below 1: only then are the timings quotable).
    """
    from ctuq.bench.machine import machine, speed_probe

    sizes = [int(s) for s in sizes]
    if device:
        settings = merge_settings(settings or {}, {"device": device})
    on_gpu = str((settings or {}).get("device", "")).startswith("cuda")
    targets = TARGETS_GPU_S if on_gpu else TARGETS_S
    doc = {"machine": machine(device or "cpu"), "scan": {**SCAN, "note": "validation split, simulated as "
                                          "the test split's scans (ctuq.bench.cases.simulate)"},
           "targets_s": {str(k): v for k, v in targets.items()},
           "settings": settings or {}, "load_start": _load(),
           "speed_probe": {"start": speed_probe()}, "sizes": []}
    for size in sizes:
        print(f"speed: {size}² ...", file=sys.stderr, flush=True)
        row = in_process({"kind": "run", "args": {"size": size, "settings": settings}})
        target = targets.get(size)
        row["within_target"] = None if target is None else bool(row["wall_s"] <= target)
        row["ratio_within_target"] = (row["total_over_dip"] is not None and
                                      row["total_over_dip"] <= targets["total_over_dip"])
        doc["sizes"].append(row)
    if demo:
        print("speed: ctuq demo ...", file=sys.stderr, flush=True)
        d = in_process({"kind": "demo", "args": {**(demo_args or {}), "settings": settings}})
        d["within_target"] = bool(d["wall_s"] <= TARGETS_S["demo"]) if not demo_args else None
        doc["demo"] = d
    if sizes and side:
        print("speed: side by side ...", file=sys.stderr, flush=True)
        sb = side_by_side(side_size or sizes[0], settings)
        sb["within_target"] = bool(sb["slowdown"] <= TARGETS_S["side_by_side_over_alone"])
        doc["side_by_side"] = sb
    doc["load_end"] = _load()
    doc["speed_probe"]["end"] = speed_probe()
    rows = list(_timed_rows(doc))
    others = [r["others_cores"] for r in rows if r.get("others_cores") is not None]
    if others:
        doc["quiet"] = max(others) < QUIET_OTHERS_CORES
    else:  # no /proc/stat: the load average at the start and before every run
        loads = [doc["load_start"]] + [r.get("load_before") for r in rows]
        loads = [v for v in loads if v is not None]
        doc["quiet"] = bool(loads) and max(v[0] for v in loads) < 1.0
    return doc


def _timed_rows(doc: dict):
    """Every timed row of a :func:`speed_benchmark` document."""
    yield from doc["sizes"]
    if "demo" in doc:
        yield doc["demo"]
    if "side_by_side" in doc:
        yield doc["side_by_side"]["alone"]
        yield doc["side_by_side"]
