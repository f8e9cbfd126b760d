"""What the ``ctuq`` command prints: errors, tables, the batch summary, progress bars.

Text that comes from files, paths or error messages is never interpreted as
Rich markup or emoji codes (a dataset named ``[/x]`` or a message with
``:x:`` is printed as it is): the consoles have markup, emoji and
highlighting off, and styled text is built from :class:`rich.text.Text` parts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn
from rich.table import Table
from rich.text import Text

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


def summary_table(outcomes) -> None:
    """The summary table, then every failure's whole reason (wrapped, never cut)."""
    table = Table(title=Text("ctuq reconstruct"))
    for col in ("file", "status", "time (s)", "PSNR (dB)", "±2σ coverage", "mean std"):
        table.add_column(col, justify="left" if col in ("file", "status") else "right",
                         overflow="fold")
    for o in outcomes:
        m = o.metrics or {}
        psnr, cov = m.get("psnr"), m.get("coverage_2sigma")
        table.add_row(Text(Path(o.input).name), Text(o.status, style=_COLOURS[o.status]),
                      f"{o.seconds:.1f}" if o.seconds else "",
                      f"{psnr:.2f}" if psnr is not None else "",
                      f"{100 * cov:.1f} %" if cov is not None else "",
                      f"{o.mean_std:.4g}" if o.mean_std is not None else "")
    out_console.print(table)
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
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}", markup=False),
                                 StageClock(),
                                 console=console, transient=transient,
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
        key = (label, stage)
        fields = {}
        if key != self._current:  # a new stage: restart its clock
            self._current = key
            fields["stage_start"] = time.monotonic()
        text = f"{label}: {stage} {message}"
        self.progress.update(self.stage, description=text[:90], completed=step,
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
