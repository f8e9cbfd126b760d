"""What the ``ctuq`` command prints: errors, tables, the batch summary, progress bars.

Text that comes from files, paths or error messages is never interpreted as
Rich markup or emoji codes (a dataset named ``[/x]`` or a message with
``:x:`` is printed as it is): the consoles have markup, emoji and
highlighting off, and styled text is built from :class:`rich.text.Text` parts.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
from rich.table import Column, Table
from rich.text import Text

from ctuq.app.batch import net_input_note, shown_image_note

#: stderr: progress, errors, notes. stdout: tables and results.
err_console = Console(stderr=True, markup=False, emoji=False, highlight=False)
out_console = Console(markup=False, emoji=False, highlight=False)


def error_line(message: str, *, prefix: str = "error: ") -> None:
    """One red ``error: ...`` line (the message printed verbatim, wrapped)."""
    err_console.print(Text.assemble((prefix, "bold red"), str(message)), overflow="fold")


def note(message: str, style: str | None = None) -> None:
    err_console.print(Text(str(message), style=style or ""), overflow="fold")


def kv_table(title: str, rows) -> None:
    """A two-column table of ``(field, value)`` strings, printed verbatim."""
    table = Table(title=Text(title), show_header=False)
    table.add_column("field", style="bold", overflow="fold")
    table.add_column("value", overflow="fold")
    for k, v in rows:
        table.add_row(Text(str(k)), Text(str(v)))
    out_console.print(table)


# -- the batch summary ------------------------------------------------------------------
_COLOURS = {"done": "green", "skipped": "cyan", "failed": "red"}
#: The data-consistency verdict (``Result.diagnostics['verdict']``).
_FIT_COLOURS = {"ok": "green", "misfit": "yellow"}


def summary_table(outcomes) -> None:
    """The summary table, then every failure's whole reason (wrapped, never cut)."""
    table = Table(title=Text("ctuq reconstruct"))
    for col in ("file", "status", "time (s)", "fit", "PSNR (dB)", "±2σ coverage", "mean std"):
        table.add_column(col, justify="left" if col in ("file", "status", "fit") else "right",
                         overflow="fold")
    for o in outcomes:
        m = o.metrics or {}
        psnr, cov = m.get("psnr"), m.get("coverage_2sigma")
        table.add_row(Text(Path(o.input).name), Text(o.status, style=_COLOURS[o.status]),
                      f"{o.seconds:.1f}" if o.seconds else "",
                      Text(o.fit or "", style=_FIT_COLOURS.get(o.fit or "")),
                      f"{psnr:.2f}" if psnr is not None else "",
                      f"{100 * cov:.1f} %" if cov is not None else "",
                      f"{o.mean_std:.4g}" if o.mean_std is not None else "")
    out_console.print(table)
    for o in outcomes:
        notes = [f"misfit: {o.fit_reason}"] if o.fit == "misfit" and o.fit_reason else []
        notes += [f"warning: {w}" for w in getattr(o, "warnings", None) or []]
        notes += [f"reconstruction: {o.image}"] if getattr(o, "image", None) else []
        for n in notes:
            out_console.print(Text.assemble((o.input, "bold"), ": ", (n, "yellow")),
                              **({"overflow": "fold"} if out_console.is_terminal
                                 else {"soft_wrap": True}))
    for o in outcomes:
        if o.error or o.note:
            style = "red" if o.status == "failed" else "cyan"
            text = o.error or o.note
            # an InputError already starts with the file; do not say it twice
            named = text.startswith(o.input) or text.startswith(str(Path(o.input).resolve()))
            # one unbroken line in a log file (grep finds it); wrapped on a terminal
            out_console.print(Text.assemble((f"{o.status}: ", style),
                                            *(() if named else ((o.input, "bold"), ": ")),
                                            text),
                              **({"overflow": "fold"} if out_console.is_terminal
                                 else {"soft_wrap": True}))


def write_summary_json(path, outcomes, *, run_id: str) -> None:
    """The outcomes as JSON (``-``: standard output)."""
    doc = {"run_id": run_id, "outcomes": [o.to_dict() for o in outcomes],
           "counts": {s: sum(o.status == s for o in outcomes)
                      for s in ("done", "skipped", "failed")}}
    text = json.dumps(doc, indent=1)
    if str(path) == "-":
        print(text)
    else:
        from ctuq.data.io import atomic_output

        with atomic_output(path, overwrite=True) as tmp:
            Path(tmp).write_text(text + "\n", encoding="utf-8")


# -- progress ---------------------------------------------------------------------------
def stage_counts(stage: str, step: int, total: int, message: str = "") -> tuple[int, int, str]:
    """The counts a user reads for a stage's progress event.

    The hyperparameter fit (``"em"``) reports E-steps: ``em_steps`` EM steps
    (an E-step and an M-step each) and one last E-step at the fitted
    hyperparameters, ``em_steps + 1`` in all. Shown as EM steps, out of
    ``em_steps`` (``em 0/1`` ... ``em 1/1`` for ``em_steps = 1``), the last
    E-step named in the message. Other stages pass through.
    """
    if stage != "em" or total <= 1:
        return step, total, message
    steps = total - 1
    # the messages number the E-steps from 0 (number em_steps is the last one);
    # shown from 1, as the counter counts
    def number(m):
        k = int(m.group(2))
        return "last E-step" if k >= steps else f"{m.group(1)} {k + 1}"

    message = re.sub(r"^(EM step|E-step) (\d+)\b", number, message)
    return min(step, steps), steps, message


class StageClock(ProgressColumn):
    """Seconds since the task's current stage began (each stage has its own clock)."""

    def render(self, task) -> Text:
        start = task.fields.get("stage_start")
        if start is None:
            return Text("")
        return Text(f"{time.monotonic() - start:6.1f} s", style="progress.elapsed")


class BatchBars:
    """A bar for the batch and one for the current stage, redrawn 4 times a second.

    The clocks move between events too (Rich refreshes on its own), so a
    long step without events still shows time passing. Where stderr is not a
    terminal (a batch job's log file), Rich draws nothing live; progress is
    then written as plain lines instead: one when a stage begins or ends and
    at most one per ``log_every`` seconds in between.
    """

    def __init__(self, n_inputs: int, *, console=None, transient: bool = False,
                 log_every: float = 60.0):
        console = console or err_console
        self.console = console
        self.log_every = float(log_every)
        self._last_line = -float("inf")
        # the description gives way (ends in "…") so the counter and the clock
        # always fit, down to an 80-column terminal
        self.progress = Progress(
            TextColumn("{task.description}", markup=False,
                       table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis",
                                           min_width=12)),
            BarColumn(bar_width=16),
            TextColumn("{task.completed:.0f}/{task.total:.0f}", markup=False, justify="right",
                       table_column=Column(no_wrap=True, min_width=5)),
            StageClock(table_column=Column(no_wrap=True, min_width=8)),
            console=console, transient=transient, expand=True,
            disable=not console.is_terminal,  # lines instead
            refresh_per_second=4)
        self.batch = self.progress.add_task("inputs", total=max(n_inputs, 1),
                                            stage_start=time.monotonic())
        self.stage = self.progress.add_task("stage", total=1, visible=False, stage_start=None)
        self._current = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def on_stage(self, label: str, stage: str, step: int, total: int, message: str = ""):
        step, total, message = stage_counts(stage, step, total, message)
        key = (label, stage)
        fields = {}
        if key != self._current:  # a new stage: restart its clock
            self._current = key
            fields["stage_start"] = time.monotonic()
        text = f"{label}: {stage} {message}"
        self.progress.update(self.stage, description=text, completed=step,
                             total=max(total, 1), visible=True, **fields)
        if not self.console.is_terminal:
            now = time.monotonic()
            if fields or step >= total or now - self._last_line >= self.log_every:
                self._last_line = now
                start = self.progress.tasks[self.stage].fields["stage_start"]
                self.console.print(Text(f"{time.strftime('%H:%M:%S')} {label}: {stage} "
                                        f"{step}/{max(total, 1)} ({now - start:.0f} s) "
                                        f"{message}".rstrip()), soft_wrap=True)

    def advance(self):
        self.progress.advance(self.batch)


# -- ctuq info --------------------------------------------------------------------------
def _num(v, digits: int = 4) -> str:
    return f"{float(v):.{digits}g}"


def describe_angles(angles_deg) -> str:
    """The angles in words: ``"180 angles from 0° to 179°, every 1° (covering 180°)"``.

    Equispaced angles (steps equal to 1e-6 of the range) name their step and
    the range they cover (``n × step``, the span from the first to one step
    past the last); other angles name their span and their smallest and
    largest step.
    """
    import numpy as np

    a = np.asarray(angles_deg, dtype=np.float64)
    n = a.size
    if n == 1:
        return f"1 angle, {_num(a[0])}°"
    head = f"{n} angles from {_num(a[0])}° to {_num(a[-1])}°"
    steps = np.diff(a)
    span = abs(a[-1] - a[0])
    if np.allclose(steps, steps[0], rtol=0, atol=1e-6 * max(span, 1e-12)) and steps[0] != 0:
        step = abs(float(steps[0]))
        return f"{head}, every {_num(step)}° (covering {_num(n * step)}°)"
    order = "ascending" if np.all(steps > 0) else "descending" if np.all(steps < 0) \
        else "unordered"
    gaps = np.abs(np.diff(np.sort(a)))
    return (f"{head}, {order}, irregular: steps {_num(gaps.min())}° to {_num(gaps.max())}° "
            f"(spanning {_num(np.ptp(a))}°)")


def geometry_rows(g, *, center_auto: bool = False) -> list[tuple[str, str]]:
    """A :class:`~ctuq.data.geometry.Geometry` in words, one row per aspect
    (``center_auto``: the centre is to be estimated from the data)."""
    h, w = g.image_shape
    p = g.pixel_size
    beam = f"{g.beam} beam"
    if g.beam == "fan":
        beam += (f": source {_num(g.source_origin)} mm from the rotation axis, detector "
                 f"{_num(g.origin_detector)} mm beyond it")
    rows = [("beam", beam), ("angles", describe_angles(g.angles_deg)),
            ("image", f"{h} × {w} pixels of {_num(p)} mm ({_num(h * p)} × {_num(w * p)} mm)"),
            ("detector", f"{g.n_detector} pixels of {_num(g.detector_spacing)} mm")]
    off = g.center_offset
    rows.append(("centre of rotation", "not given: estimated from the data when "
                 "reconstructed (center_offset auto)" if center_auto else
                 "the detector centre (offset 0)" if off == 0 else
                 f"{_num(abs(off))} detector pixels {'right' if off > 0 else 'left'} of the "
                 f"detector centre (offset {_num(off)})"))
    if any(g.image_offset):
        rows.append(("image centre", f"offset by ({_num(g.image_offset[0])}, "
                                     f"{_num(g.image_offset[1])}) pixels from the axis"))
    return rows


#: Labels of the metrics ``ctuq info`` shows first, in this order.
_METRICS = {"psnr": ("PSNR", " dB"), "psnr_fbp": ("PSNR of the FBP", " dB"),
            "ssim": ("SSIM", ""), "rmse": ("RMSE", ""),
            "pixel_log_likelihood": ("log-likelihood per pixel", " nats"),
            "pixel_log_likelihood_posterior": ("log-likelihood per pixel, posterior std only",
                                               " nats"),
            "spearman_std_abs_error": ("Spearman(std, |error|)", ""),
            "num_samples": ("predictive samples", "")}


def _images_row(r) -> str:
    names = [("reconstruction", "reconstruction"), ("std", "total std"),
             ("posterior_std", "posterior std"), ("model_error_std", "model-error std"),
             ("variance", "variance"), ("fbp", "FBP"), ("dip", "DIP fit"),
             ("ground_truth", "ground truth")]
    have = [label for key, label in names if getattr(r, key) is not None]
    shape = r.image.shape
    size = " × ".join(map(str, shape[-2:])) + " pixels"
    if len(shape) == 3:
        size = f"{shape[0]} slices of {size}"
    return f"{', '.join(have)}: {size}" + (f", in {r.units}" if r.units else "")


def result_rows(r) -> list[tuple[str, str]]:
    """What ``ctuq info`` shows of a :class:`~ctuq.data.io.Result` (nothing shown as None)."""
    unit = f" {r.units}" if r.units else ""
    rows = [("images", _images_row(r))]
    if r.std is not None:
        parts = [f"{_num(r.std.mean())}{unit} total"]
        split = [f"{label} {_num(v.mean())}" for label, v in
                 (("posterior", r.posterior_std), ("model error", r.model_error_std))
                 if v is not None]
        rows.append(("mean std", parts[0] + (f" ({', '.join(split)})" if split else "")))
    if r.samples is not None:
        rows.append(("posterior samples", str(r.samples.shape[-3])))
    if r.geometry is not None:
        rows += geometry_rows(r.geometry)
    made = f"{str(r.created).replace('T', ' ').replace('+00:00', ' UTC')} by ctuq {r.version}"
    prov = r.provenance or {}
    device = r.device or prov.get("device")
    if device:
        made += f" on {device}"
    if "threads" in prov:
        made += f", {prov['threads']} thread{'s' if prov['threads'] != 1 else ''}"
    if r.seed is not None:
        made += f", seed {r.seed}"
    rows.append(("made", made))
    if r.input_path:
        rows.append(("input", r.input_path + (f" (sha256 {r.input_sha256[:12]}…)"
                                              if r.input_sha256 else "")))
    unc = (r.config or {}).get("uncertainty") or {}
    if unc.get("method"):
        how = f"{unc['method']}"
        if unc.get("prior"):
            how += f", prior {unc['prior']}"
        if unc.get("model_error"):
            how += f", model error {unc['model_error']}"
        rows.append(("uncertainty", how))
        image = shown_image_note(r.config)
        if image:  # the image is not the DIP output: say which, and how far
            rows.append(("reconstruction", image))
        chosen = net_input_note(r.config)
        if chosen:  # dip.net_input = 'auto': what the held-out fits chose
            rows.append(("network input", chosen))
    rows += _hyperparameter_rows(r.hyperparameters, r.em_trace)
    rows += _metric_rows(r.metrics)
    rows += diagnostic_rows(r.diagnostics, r.residual)
    rows += stage_rows(prov.get("stages"))
    if prov.get("versions"):
        rows.append(("libraries", ", ".join(f"{k} {v}" for k, v in prov["versions"].items())))
    return rows


def diagnostic_rows(d: dict, residual=None) -> list[tuple[str, str]]:
    """``ctuq info``'s rows of ``Result.diagnostics``: the fit's verdict, the
    centre estimate, the data warnings."""
    d = d or {}
    rows = []
    if d.get("verdict"):
        line = f"{d['verdict']}: {d.get('reason', '')}".rstrip(": ")
        if residual is not None:
            line += " (whitened residual stored)"
        rows.append(("data consistency", line))
    c = d.get("center")
    if isinstance(c, dict):
        est, std = c.get("estimate"), c.get("std")
        est = "undetermined" if est is None else (
            f"{_num(est)} ± {_num(std, 2)} px" if std is not None else f"{_num(est)} px")
        rows.append(("centre of rotation",
                     f"offset used {_num(c.get('used', 0.0))} px; estimate {est} "
                     f"({c.get('method', '?')}, confidence {_num(c.get('confidence', 0.0), 2)})"))
    for w in d.get("warnings") or []:
        rows.append(("warning", str(w)))
    return rows


def stage_rows(stages) -> list[tuple[str, str]]:
    """``ctuq info``'s row of ``provenance['stages']``: seconds per stage, counts."""
    if not isinstance(stages, dict) or not isinstance(stages.get("seconds"), dict):
        return []
    sec = stages["seconds"]
    parts = [f"{k.replace('_', ' ')} {float(v):.2f}" for k, v in sec.items()
             if k != "total" and isinstance(v, (int, float))]
    line = ", ".join(parts)
    if isinstance(sec.get("total"), (int, float)):
        line = f"{float(sec['total']):.2f} total: " + line
    rows = [("stage seconds", line)]
    counts = stages.get("counts") or {}
    if counts:
        rows.append(("iterations", ", ".join(f"{k.replace('_', ' ')} {v}"
                                             for k, v in counts.items())))
    return rows


def _hyperparameter_rows(hp: dict, trace: list) -> list[tuple[str, str]]:
    hp = dict(hp or {})
    rows = []
    names = hp.pop("block_names", None)
    a_b = hp.pop("a_b", None)
    if a_b is not None:
        a_list = a_b if isinstance(a_b, (list, tuple)) else [a_b]
        if names and len(names) == len(a_list) and len(a_list) > 1:
            text = ", ".join(f"{n} {_num(v)}" for n, v in zip(names, a_list))
        else:
            text = ", ".join(_num(v) for v in a_list)
        rows.append(("prior scale a_b", text))
    l_b = hp.pop("l_b", None)
    if l_b:
        rows.append(("prior length scales", ", ".join(_num(v) for v in l_b)))
    sigma2 = hp.pop("sigma2", None)
    learned = hp.pop("noise_learned", None)
    if sigma2 is not None:
        rows.append(("noise variance σ²", _num(sigma2) + {True: " (learned)",
                                                          False: " (fixed)"}.get(learned, "")))
    gamma = hp.pop("gamma_total", None)
    if gamma is not None:
        rows.append(("effective parameters γ̂", _num(gamma, 5)))
    steps = hp.pop("em_steps", None)
    converged = hp.pop("converged", None)
    if steps is not None or trace:
        n = steps if steps is not None else len(trace)
        text = f"{n} EM step{'s' if n != 1 else ''}"
        if converged is True:
            text += (", converged (the hyperparameters moved by less than em_tol for "
                     "em_patience steps in a row)")
        elif converged is False and n:
            text += (" (the em_steps limit; more steps could still move the hyperparameters "
                     "by more than em_tol)")
        rows.append(("hyperparameter fit", text))
    for skip in ("block_sizes", "matern_blocks", "gamma_hat", "prior"):
        hp.pop(skip, None)
    for k, v in hp.items():
        if v is None or (k == "predcp_weight" and not v):
            continue
        rows.append((k.replace("_", " "), _short(v)))
    return rows


def _metric_rows(metrics: dict) -> list[tuple[str, str]]:
    m = dict(metrics or {})
    if not m:
        return []
    rows = []
    for key, (label, unit) in _METRICS.items():
        if key in m:
            rows.append((label, f"{_num(m.pop(key))}{unit}"))
    cov = [m.pop(f"coverage_{k}sigma", None) for k in (1, 2, 3)]
    if all(c is not None for c in cov):
        rows.append(("±1σ / ±2σ / ±3σ coverage", " / ".join(f"{100 * c:.1f}" for c in cov)
                     + " %  (ideal 68.3 / 95.4 / 99.7)"))
    for k in (1, 2, 3):
        c = m.pop(f"coverage_{k}sigma_posterior", None)
        if c is not None:
            rows.append((f"±{k}σ coverage, posterior std only", f"{100 * c:.1f} %"))
    patches = sorted((k for k in m if k.startswith("patch_log_likelihood_")),
                     key=lambda k: int(k.rsplit("_", 1)[1]) if k.rsplit("_", 1)[1].isdigit()
                     else 0)
    if patches:
        rows.append(("patch log-likelihoods", ", ".join(_num(m.pop(k), 3) for k in patches)
                     + f" (patches 1–{len(patches)} px)"))
    m.pop("mean_std", None)  # shown above
    for k, v in m.items():
        rows.append((k.replace("_", " "), _num(v)))
    return rows


def sinogram_rows(s) -> list[tuple[str, str]]:
    """What ``ctuq info`` shows of a :class:`~ctuq.data.io.Sinogram`."""
    from ctuq.data.io.options import is_auto

    shape = s.data.shape
    text = f"{shape[-2]} angles × {shape[-1]} detector pixels"
    if len(shape) == 3:
        text = f"{shape[0]} slices of {text}"
    rows = [("sinogram", text)]
    meta = dict(s.meta)
    rows += geometry_rows(s.geometry, center_auto=is_auto(meta.pop("center_offset", None)))
    rows.append(("ground truth", "yes" if s.ground_truth is not None else "no"))
    if meta.pop("angles_assumed", False):
        rows.append(("note", "the file has no angles: equispaced ones were assumed"))
    for k, v in meta.items():
        if v is not None:
            rows.append((k.replace("_", " "), _short(v)))
    return rows


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        return f"[{', '.join(_short(v) for v in value[:6])}, …] ({len(value)})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)
