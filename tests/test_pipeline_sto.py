"""The mini-batched sample-then-optimise sampler from a TOML ``[uncertainty]`` table (issue 24
item 4): ``sampler = "sto"`` with ``sto_batch_size`` / ``sto_iterations`` reaches the engine's
STOOptions and runs a tiny CT reconstruction end to end into a valid result file."""

from __future__ import annotations

import numpy as np
import pytest

import ctuq
from ctuq.data.geometry import Geometry
from ctuq.data.io import Sinogram, read_result, write_sinogram
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import InputError
from ctuq.posterior import STOSampler
from ctuq.recon.config import ReconstructionConfig, UncertaintyConfig
from ctuq.recon.evidence import PIPELINE_STO_ITERATIONS, uncertainty_options

pytestmark = pytest.mark.usefixtures("one_thread")

TOML = """
preset = "reference-28"
threads = 1
[dip]
iterations = 30
[uncertainty]
sampler = "sto"
sto_batch_size = 5
sto_iterations = 60
em_steps = 1
n_samples = 2
predictive_samples = 8
stored_samples = 2
predcp = false
model_error = "none"
"""


def test_sto_options_reach_the_engine():
    default = uncertainty_options(UncertaintyConfig(sampler="sto"), learn_noise=False)
    opts = default["sampler"].options
    assert isinstance(default["sampler"], STOSampler)
    assert (opts.iterations, opts.batch_size) == (PIPELINE_STO_ITERATIONS, None)
    sto = uncertainty_options(UncertaintyConfig(sampler="sto", sto_batch_size=7,
                                                sto_iterations=123), learn_noise=False)
    assert (sto["sampler"].options.iterations, sto["sampler"].options.batch_size) == (123, 7)


@pytest.mark.parametrize("key, value", [("sto_batch_size", 0), ("sto_batch_size", 2.5),
                                        ("sto_iterations", 0), ("sto_iterations", True)])
def test_bad_sto_settings_name_the_key(tmp_path, key, value):
    path = tmp_path / "bad.toml"
    path.write_text(f"[uncertainty]\nsampler = 'sto'\n{key} = {str(value).lower()}\n")
    with pytest.raises(InputError) as err:
        ReconstructionConfig.from_toml(path)
    assert err.value.field == f"uncertainty.{key}" and err.value.file == str(path)


def test_minibatched_sto_from_toml_end_to_end(tmp_path):
    g = Geometry.parallel(28, 20)
    truth = digits(1)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g), 0.05, seed=1)
    src = tmp_path / "scan.h5"
    write_sinogram(src, Sinogram(y.numpy(), g, {"noise_std": sigma}, ground_truth=truth))
    cfg_path = tmp_path / "sto.toml"
    cfg_path.write_text(TOML)
    cfg = ReconstructionConfig.from_toml(cfg_path)
    out = tmp_path / "scan_recon.h5"
    ctuq.reconstruct_file(src, out, cfg)
    res = read_result(out)
    sampler = res.config["evidence"]["sampler"]
    assert sampler["method"] == "sto" and sampler["batch_size"] == 5
    assert sampler["iterations"] == 60
    # a mini-batched solve runs all its steps (no full-batch early stop)
    assert res.em_trace and all(t["solver_iterations"] == 60 for t in res.em_trace)
    std = np.asarray(res.std)
    assert std.shape == (28, 28) and np.isfinite(std).all() and (std > 0).all()
    np.testing.assert_allclose(std, res.posterior_std, rtol=1e-6)   # model_error = none
    # more angles per batch than the scan has: one clear error naming the key
    with pytest.raises(InputError, match="between 1 and the 20"):
        ctuq.reconstruct(Sinogram(y.numpy(), g, {"noise_std": sigma}),
                         cfg.merged({"uncertainty": {"sto_batch_size": 21}}))
