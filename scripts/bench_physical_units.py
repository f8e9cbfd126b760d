"""ctuq on a scan in physical units (values x 0.03 /mm), normalize on and off, against FBP.

Prints one JSON document (ctuq.bench.physical_units.run).
"""

import argparse
import json
import sys

from ctuq.bench.physical_units import run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--split", default="validation", choices=("tuning", "validation", "test"))
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--angles", type=int, default=60)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--attenuation", type=float, default=0.03)
    ap.add_argument("--model-error", default="none")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    doc = run(split=a.split, index=a.index, size=a.size, n_angles=a.angles, noise=a.noise,
              attenuation=a.attenuation, threads=a.threads, model_error=a.model_error)
    json.dump(doc, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
