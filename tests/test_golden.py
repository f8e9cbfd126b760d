"""Pinned outputs of seeded CT and classification runs (``tests/golden_runs.py``).

The engine's refactors must leave them unchanged: on the machine that wrote
``tests/golden/golden.npz`` they are bit-identical (``golden_runs.py --check``);
here the comparison allows a relative 1e-6 (plus 1e-9 absolute for entries near
zero), so that another CPU's float summation order does not fail it while any
change of the algorithm (a draw, a step, a default) does.
"""

import numpy as np
import pytest

import golden_runs

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


@pytest.fixture(scope="module")
def reference():
    with np.load(golden_runs.GOLDEN) as f:
        return dict(f)


def test_golden_outputs_are_unchanged(reference):
    diffs = golden_runs.compare(golden_runs.run_all(), reference, rtol=1e-6, atol=1e-9)
    assert not diffs, "\n".join(diffs)
