"""The benchmarks' records: JSON cleaning and writing, and the resumable case runner.

One resume mechanism for every benchmark: each finished case is appended at
once, as one JSON line, to a ``--partial`` file; a rerun reads the file back
and runs only the cases it lacks, so an interrupted run loses at most the
cases in flight. Cases are dicts with a unique ``"id"``.

Examples
--------
>>> import tempfile, os
>>> part = os.path.join(tempfile.mkdtemp(), "cases.jsonl")
>>> run = lambda case: {"id": case["id"], "x": 2 * case["id"]}
>>> run_resumable([{"id": 1}, {"id": 2}], part, run)
[{'id': 1, 'x': 2}, {'id': 2, 'x': 4}]
>>> sorted(read_cases(part))          # read back, not rerun
[1, 2]
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Callable

import numpy as np

log = logging.getLogger("ctuq.bench")

__all__ = ["clean", "dump_json", "read_cases", "append_case", "run_resumable",
           "read_case_file", "repo_relative", "parse_variant", "merge_settings"]


def clean(o):
    """JSON-safe: non-finite floats → None, tensors and arrays → lists, numpy scalars → Python."""
    import torch

    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if isinstance(o, (torch.Tensor, np.ndarray)):
        return clean(o.tolist())
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(o) else None
    if isinstance(o, (np.integer,)):
        return int(o)
    return o


def dump_json(doc, stream=None, path=None) -> str:
    """Write ``clean(doc)`` as indented JSON to ``stream`` (default stdout) and/or ``path``.

    Returns the text (without the final newline).
    """
    import sys

    text = json.dumps(clean(doc), indent=1)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    if stream is not None or path is None:
        print(text, file=stream or sys.stdout)
    return text


def read_cases(path, key="id") -> dict:
    """Finished cases of an interrupted run: the JSON lines of ``path`` by ``case[key]``.

    ``key`` may also be a callable of the row (e.g. a ``(case, setting)``
    pair for rows of several settings per case). A later line of the same
    case wins (a completed row appended after its first version). Missing
    file or no path: an empty dict.
    """
    done = {}
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    c = json.loads(line)
                    done[key(c) if callable(key) else c[key]] = c
        log.info("%d finished cases read from %s", len(done), path)
    return done


def append_case(path, case: dict) -> None:
    """Append one finished case to the JSON-lines file ``path`` (no-op without a path)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(clean(case)) + "\n")


def _call_case(fn, case, previous):
    """``fn(case)``, or ``fn(case, previous=row)`` to complete a read-back row (picklable)."""
    return fn(case) if previous is None else fn(case, previous=previous)


def run_resumable(cases: list[dict], partial, run_one: Callable, jobs: int = 1,
                  pool_run: Callable | None = None,
                  complete: Callable[[dict], bool] | None = None) -> list[dict]:
    """Every case's result, by ``run_one(case)``, resuming from the JSON lines of ``partial``.

    Parameters
    ----------
    cases : list of dict
        Each with a unique ``"id"``; results come back in this order.
    partial : path-like or None
        The JSON-lines file: cases already there (by ``id``) are read back,
        not rerun; each finished case is appended at once. None: nothing kept.
    run_one : callable
        ``run_one(case) -> dict`` (the dict has the case's ``id``).
    jobs : int
        Cases at a time; above 1 a process pool runs ``pool_run``.
    pool_run : callable, optional
        What the pool runs (default ``run_one``; must be picklable, e.g. one
        that first sets up the worker's logging).
    complete : callable, optional
        A read-back row for which ``complete(row)`` is false is passed on as
        ``run_one(case, previous=row)`` to be completed; the completed row is
        appended and, being the last, wins on the next read-back. Default:
        every row is complete.

    Returns
    -------
    list of dict
    """
    import concurrent.futures as cf

    done = read_cases(partial, "id")
    todo = [(c, None) for c in cases if c["id"] not in done]
    if complete is not None:
        todo += [(c, done[c["id"]]) for c in cases
                 if c["id"] in done and not complete(done[c["id"]])]
    count = iter(range(1, len(todo) + 1))

    def keep(res):
        res = clean(res)
        done[res["id"]] = res
        append_case(partial, res)
        log.info("finished %s (%d/%d)", res["id"], len(cases) - len(todo) + next(count),
                 len(cases))

    if jobs > 1 and len(todo) > 1:
        with cf.ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(_call_case, pool_run or run_one, c, prev) for c, prev in todo]
            for fut in cf.as_completed(futures):
                keep(fut.result())
    else:
        for c, prev in todo:
            keep(_call_case(run_one, c, prev))
    return [done[c["id"]] for c in cases]


def read_case_file(path) -> list[dict]:
    """The result rows of a benchmark document (its ``"cases"``) or of a ``--partial`` file."""
    text = Path(path).read_text()
    try:
        return json.loads(text)["cases"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return list(read_cases(path, "id").values())


def repo_relative(path, root=None) -> str:
    """``path`` relative to ``root`` when it lies inside it (portable documents).

    Default ``root``: the folder that holds the ``ctuq`` package (the
    repository, in a source checkout).
    """
    root = Path(root).resolve() if root else Path(__file__).resolve().parents[2]
    p = Path(path).resolve()
    return str(p.relative_to(root)) if p.is_relative_to(root) else str(path)


def _top_level_split(text: str) -> list[str]:
    """``text`` split at the commas that are outside ``[]``/``{}`` and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_variant(text: str) -> tuple[str, dict]:
    """A ``--variant`` of the script: ``NAME:key=value,...`` → ``("_NAME", settings)``.

    Values are read as TOML values (``1e4``, ``true``, ``"x"``, ``[16, 16]``; a
    bare word stays a string); dotted keys name tables (``dip.iterations=500``).
    Pairs are split at the commas outside brackets and quotes, so a list is one
    value (``dip.unet={scales=4, channels=[16, 16, 16, 16]}``).
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    name, _, pairs = text.partition(":")
    settings: dict = {}
    for pair in _top_level_split(pairs):  # non-empty, stripped
        key, _, value = pair.partition("=")
        *tables, leaf = key.strip().split(".")
        node = settings
        for t in tables:
            node = node.setdefault(t, {})
        try:
            node[leaf] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            node[leaf] = value.strip()
    return "_" + name.strip(), settings


def merge_settings(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` merged in, table by table (neither is changed)."""
    out = dict(base)
    for k, v in changes.items():
        out[k] = merge_settings(out[k], v) if isinstance(v, dict) and isinstance(
            out.get(k), dict) else v
    return out
