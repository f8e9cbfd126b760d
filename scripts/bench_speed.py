#!/usr/bin/env python
"""How long a default reconstruction takes, stage by stage (ctuq.bench.speed).

Prints one JSON document on stdout (progress on stderr): per image size one
default run (64² and 128²; 512² only with ``--sizes 64,128,512``, about 20 min
on 2 cores) of a validation-split scan simulated as the test split's scans
are (ellipses image 0, parallel beam, 60 angles, 5 % noise), its seconds
per stage from the result's provenance and the ratio total / DIP fit;
``ctuq demo`` timed as a user runs it; two identical runs side by side
(two processes) against one alone; the machine, the threads and the load
average (``quiet`` is false when anything else loaded the machine: such
timings are not quotable), and ``speed_probe`` before the first run and after
the last (how fast the machine itself ran: a virtual machine has slow days
with no load to show them). Every run is a fresh process.

``--compare`` instead runs the setting variants of docs/speed.md on a few
validation scans (seconds saved, change of mean std and ±2σ coverage).

Usage::

    python scripts/bench_speed.py > benchmarks/results/bench_speed.json
    python scripts/bench_speed.py --sizes 64,128,512
    python scripts/bench_speed.py --device cuda --sizes 64,128,256,512 --no-demo --no-side-by-side
    python scripts/bench_speed.py --compare --sizes 64 --cases 3 > benchmarks/results/speed_settings.json
    python scripts/bench_speed.py --sizes 16 --settings '{"dip": {"iterations": 5}}' --demo-size 16
"""

from __future__ import annotations

import argparse
import json
import sys

from ctuq.bench.runner import dump_json
from ctuq.bench.speed import SPEED_VARIANTS, compare_settings, speed_benchmark, validation_scans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128", help="image sides, comma-separated")
    ap.add_argument("--settings", default=None,
                    help="JSON overrides for every run (tests: few iterations)")
    ap.add_argument("--no-demo", action="store_true", help="skip the ctuq demo timing")
    ap.add_argument("--demo-size", type=int, default=None, help="ctuq demo --size")
    ap.add_argument("--demo-angles", type=int, default=None, help="ctuq demo --angles")
    ap.add_argument("--side-size", type=int, default=None,
                    help="image side of the side-by-side runs (default: the first size)")
    ap.add_argument("--device", default=None,
                    help="cuda: every run on the GPU, judged by the GPU targets")
    ap.add_argument("--no-side-by-side", action="store_true", help="skip the side-by-side runs")
    ap.add_argument("--compare", action="store_true",
                    help="time the setting variants on validation scans instead")
    ap.add_argument("--variants", default=None,
                    help="--compare: JSON {name: settings}; default the speed variants")
    ap.add_argument("--cases", type=int, default=3, help="--compare: validation scans")
    ap.add_argument("--share-dip", action="store_true",
                    help="--compare: fit each scan's DIP once (first variant) and give the "
                         "other variants its fits (variants of the uncertainty stage only)")
    ap.add_argument("--angles", type=int, default=60, help="--compare: the scans' angles")
    ap.add_argument("--noise", type=float, default=0.05,
                    help="--compare: the scans' relative noise level")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    settings = json.loads(args.settings) if args.settings else None
    if args.compare:
        variants = json.loads(args.variants) if args.variants else SPEED_VARIANTS
        doc = compare_settings(variants, sizes, validation_scans(args.cases, args.angles, args.noise),
                               base=settings, share_dip=args.share_dip)
    else:
        demo_args = {k: v for k, v in (("size", args.demo_size), ("angles", args.demo_angles))
                     if v is not None}
        doc = speed_benchmark(sizes, settings=settings, demo=not args.no_demo,
                              demo_args=demo_args or None, side_size=args.side_size,
                              device=args.device, side=not args.no_side_by_side)
    doc["script"] = "scripts/bench_speed.py"
    doc["argv"] = sys.argv[1:] if argv is None else list(argv)
    dump_json(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
