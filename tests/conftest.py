"""Shared fixtures: a private matrix cache, thread counts, the 28² toy problem and the 28²
digit scan, CUDA detection."""

import os
import subprocess

import pytest
import torch


def pytest_configure(config):
    # Under pytest-xdist (``make test`` runs two workers) each worker takes one
    # core: two workers of two OpenMP threads each on a 2-core machine spin
    # against each other (docs/speed.md, "Sharing a busy machine"). A test that
    # needs two threads pins them itself.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True, scope="session")
def _matrix_cache(tmp_path_factory):
    # tests never touch the user's ~/.cache
    os.environ.setdefault("CTUQ_CACHE_DIR", str(tmp_path_factory.mktemp("ctuq-cache")))
    yield


def cuda_available() -> bool:
    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (``pytest.mark.usefixtures("one_thread")``).

    Tiny batched products gain nothing from a second thread, and on a busy
    2-core machine two oversubscribed OpenMP threads make them 3–4× slower
    (measured); the previous count is restored afterwards.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def problem():
    """The 28² toy problem of :func:`toy_problem.toy_problem` (a module may override)."""
    from toy_problem import toy_problem

    return toy_problem()


@pytest.fixture(scope="module")
def lin(problem):
    """The problem's linearisation at its fitted weights."""
    return problem.linearization()


@pytest.fixture(scope="module")
def lik(problem, lin):
    """The problem's Gaussian likelihood through its ray transform (``Φ = A J``)."""
    from ctuq.recon.evidence import ct_likelihood

    return ct_likelihood(lin, problem.op, problem.y)


def digit_sinogram(n_angles: int | None = 20, *, angles=None, seed: int = 1):
    """The tests' 28² scan: the first digit, parallel beam, 5 % Gaussian noise (``seed``).

    ``n_angles`` mid-point angles over 180°, or ``angles`` (radians) when given. A
    :class:`~ctuq.data.io.Sinogram` with ``noise_std`` and the ground truth.
    """
    from ctuq.data.geometry import Geometry
    from ctuq.data.io import Sinogram
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import digits
    from ctuq.data.simulate import simulate_sinogram

    g = Geometry.parallel(28, angles=angles) if angles is not None else Geometry.parallel(28, n_angles)
    truth = digits(1)[0]
    y, sigma = simulate_sinogram(truth, RayTransform(g), 0.05, seed=seed)
    return Sinogram(y.numpy(), g, {"noise_std": sigma}, ground_truth=truth)


def small_dip_problem(iterations: int = 150):
    """A 28² digit, 20 angles, 5 % noise, an 8-channel U-net fitted for ``iterations``:
    ``d_θ`` ≈ 5 k, small enough for the dense float64 posterior.

    A namespace with ``op``, ``x`` (truth), ``y``, ``sigma``, ``dip``, ``lin``
    (the linearisation at the fit), ``lik`` (its CT likelihood), ``tv_weight``.
    """
    from types import SimpleNamespace

    from ctuq.data.geometry import Geometry
    from ctuq.data.operators import RayTransform
    from ctuq.data.phantoms import digits
    from ctuq.data.simulate import simulate_sinogram
    from ctuq.models.unet import unet_preset
    from ctuq.posterior import Linearization
    from ctuq.recon.dip import DIPConfig, fit_dip
    from ctuq.recon.evidence import ct_likelihood

    op = RayTransform(Geometry.parallel(28, 20))
    x = digits(1, 28, seed=0)[0]
    y, sigma = simulate_sinogram(x, op, 0.05, seed=1)
    cfg = DIPConfig.for_image_size(28, seed=0, progress_every=10**6).with_(
        iterations=iterations, unet=unet_preset("reference-28").with_(channels=(8, 8, 8)))
    dip = fit_dip(y, op, cfg, noise_std=sigma)
    lin = Linearization(dip.model, dip.net_input)
    return SimpleNamespace(op=op, x=x, y=y, sigma=sigma, dip=dip, lin=lin,
                           tv_weight=dip.tv_weight, lik=ct_likelihood(lin, op, y))


def sample_posterior(likelihood, prior, noise_var, k, method="cg", **kw):
    """A sampler call with its options as keywords (``method``: 'cg' or 'sto')."""
    from ctuq.posterior import CGOptions, CGSampler, STOOptions, STOSampler

    names = ("generator", "warm_start", "redraw", "theta_star0", "z0", "preconditioner",
             "progress", "cancel", "stage")
    call = {n: kw.pop(n) for n in names if n in kw}
    sampler = CGSampler(CGOptions(**kw)) if method == "cg" else STOSampler(STOOptions(**kw))
    return sampler.sample(likelihood, prior, noise_var, k, **call)


@pytest.fixture
def small_disk(tmp_path):
    """A 200 kB tmpfs (root only; skipped where it cannot be mounted)."""
    d = tmp_path / "small_disk"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {p.stderr.strip() or p.returncode}")
    try:
        yield d
    finally:
        if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(d)], capture_output=True)


@pytest.fixture
def strict_fp32():
    """Full float32 on CUDA for one test: no TF32 in cuDNN convolutions or matmuls.

    torch lets cuDNN run float32 convolutions in TF32 on Ampere and later
    (a 10-bit mantissa): a CUDA result then differs from the CPU's by about
    1e-3 relative (seen on an H200), which says nothing about ctuq's code.
    The CPU-against-CUDA comparisons run without it; the previous flags are
    restored afterwards.
    """
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def load_script(name: str):
    """The module of ``scripts/<name>.py`` (scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
