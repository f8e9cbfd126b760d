"""DIP+TV trainer and MC-dropout DIP on tiny problems (16² and 28², tens of iterations)."""

import math

import numpy as np
import pytest
import torch

from ctuq.data.geometry import Geometry
from ctuq.data.operators import RayTransform
from ctuq.data.phantoms import digits
from ctuq.data.simulate import simulate_sinogram
from ctuq.errors import Cancelled, InputError
from ctuq.models.unet import UNetConfig, build_unet
from ctuq.recon.dip import DIPConfig, fit_dip, load_weights, save_weights, total_variation
from ctuq.recon.mc_dropout import fit_mc_dropout, mc_dropout_predict
from ctuq.progress import ProgressEvent

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2))


@pytest.fixture(scope="module")
def problem():
    """A 16×16 digit, 10 angles, 5 % noise."""
    op = RayTransform(Geometry.parallel(16, 10), backend="matrix", device="cpu")
    x = digits(1, size=16, seed=0)[0]
    y, _ = simulate_sinogram(x, op, 0.05, seed=1)
    return op, x, y


def tiny_config(**kw):
    base = dict(unet=TINY, iterations=30, lr=1e-2, tv_weight=0.1, device="cpu",
                progress_every=10)
    base.update(kw)
    return DIPConfig(**base)


def test_total_variation_is_the_anisotropic_sum():
    x = torch.tensor([[0.0, 1.0], [3.0, 3.0]])
    # vertical |3-0| + |3-1|, horizontal |1-0| + |3-3|
    assert total_variation(x).item() == pytest.approx(6.0)
    assert total_variation(torch.stack([x, 2 * x])).tolist() == [6.0, 12.0]


def test_loss_decreases(problem):
    op, x, y = problem
    res = fit_dip(y, op, tiny_config(iterations=40))
    loss = res.loss_history["loss"]
    assert loss.shape == (40,)
    assert res.best_loss < 0.5 * loss[0]
    assert loss[-5:].mean() < loss[:5].mean()
    assert np.allclose(loss, res.loss_history["data_fit"] + 0.1 * res.loss_history["tv"],
                       rtol=1e-5)
    assert res.reconstruction.shape == (16, 16)
    assert res.wall_time > 0


def test_lowest_loss_iterate_is_returned(problem):
    op, x, y = problem
    # a constant, too-large learning rate makes the loss jump around
    res = fit_dip(y, op, tiny_config(iterations=40, lr=0.2, lr_schedule="constant",
                                     clip_grad_norm=None))
    loss = res.loss_history["loss"]
    assert res.best_iteration == int(np.argmin(loss))
    assert res.best_iteration < len(loss) - 1, "test needs a non-monotone loss"
    assert res.best_loss == pytest.approx(loss.min())
    assert not res.model.training
    with torch.no_grad():
        out = res.model(res.net_input)
        again = ((op(out) - y).square().sum() + 0.1 * total_variation(out).sum()).item()
    assert again == pytest.approx(res.best_loss, rel=1e-5)
    assert torch.equal(out.reshape(16, 16), res.reconstruction)
    for k, v in res.model.state_dict().items():
        assert torch.equal(v, res.state_dict[k])


def test_cancel_stops_within_one_progress_interval(problem):
    op, x, y = problem
    events = []
    state = {"cancel": False, "checks_after": 0}

    def progress(event):
        events.append(event)
        state["cancel"] = True  # ask to stop at the first report

    def cancel():
        if state["cancel"]:
            state["checks_after"] += 1
        return state["cancel"]

    with pytest.raises(Cancelled):
        fit_dip(y, op, tiny_config(iterations=1000, progress_every=5),
                progress=progress, cancel=cancel)
    assert [(e.stage, e.step, e.total) for e in events] == [("dip", 5, 1000)]
    assert isinstance(events[0], ProgressEvent) and "loss" in events[0].message
    assert state["checks_after"] == 1


def test_progress_with_keyword_callback(problem):
    op, x, y = problem
    seen = []
    fit_dip(y, op, tiny_config(iterations=25, progress_every=10),
            progress=lambda stage, step, total, message="": seen.append((stage, step, total)))
    assert seen == [("dip", 10, 25), ("dip", 20, 25), ("dip", 25, 25)]


def test_monitor_sees_the_lowest_loss_iterate_so_far(problem):
    op, x, y = problem
    seen = []
    res = fit_dip(y, op, tiny_config(iterations=25, progress_every=10, lr=0.2,
                                     lr_schedule="constant", clip_grad_norm=None),
                  monitor=lambda it, img: seen.append((it, img.clone())))
    assert [it for it, _ in seen] == [10, 20, 25]
    assert all(img.shape == (16, 16) and not img.requires_grad for _, img in seen)
    # the last view is what the fit returns; an earlier one is the best iterate up to it
    assert torch.equal(seen[-1][1], res.reconstruction)
    loss = res.loss_history["loss"]
    with torch.no_grad():
        first = ((op(seen[0][1]) - y).square().sum() + 0.1 * total_variation(seen[0][1])).item()
    assert first == pytest.approx(loss[:10].min(), rel=1e-5)


def test_same_seed_same_reconstruction_on_cpu(problem):
    op, x, y = problem
    a = fit_dip(y, op, tiny_config(iterations=15, seed=4))
    b = fit_dip(y, op, tiny_config(iterations=15, seed=4))
    c = fit_dip(y, op, tiny_config(iterations=15, seed=5))
    assert torch.equal(a.reconstruction, b.reconstruction)
    assert np.array_equal(a.loss_history["loss"], b.loss_history["loss"])
    assert not torch.equal(a.reconstruction, c.reconstruction)


def test_noise_input_is_seeded(problem):
    op, x, y = problem
    a = fit_dip(y, op, tiny_config(iterations=3, net_input="noise", seed=2))
    b = fit_dip(y, op, tiny_config(iterations=3, net_input="noise", seed=2))
    assert torch.equal(a.net_input, b.net_input)
    assert a.net_input.std().item() == pytest.approx(0.1, rel=0.3)
    fbp = fit_dip(y, op, tiny_config(iterations=1))
    assert torch.allclose(fbp.net_input[0, 0], op.fbp(y))


def test_warm_start_from_saved_weights(problem, tmp_path):
    op, x, y = problem
    first = fit_dip(y, op, tiny_config(iterations=30))
    path = tmp_path / "w.pt"
    first.save_weights(path)
    second = fit_dip(y, op, tiny_config(iterations=5, init_weights=str(path)))
    # the warm start begins exactly where the first fit's best iterate was
    assert second.loss_history["loss"][0] == pytest.approx(first.best_loss, rel=1e-5)
    # and the saved file loads into a fresh network of the same architecture
    net = load_weights(build_unet(TINY, seed=9), path)
    assert torch.equal(net.out.weight, first.model.out.weight)


def test_bad_weights_files_raise_input_error(problem, tmp_path):
    op, x, y = problem
    other = tmp_path / "other.pt"
    save_weights(build_unet(UNetConfig(scales=2, channels=(4, 4), skip_channels=(0, 2))), other)
    with pytest.raises(InputError, match="channels"):
        fit_dip(y, op, tiny_config(init_weights=str(other)))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(InputError, match="init_weights"):
        load_weights(build_unet(TINY), junk)
    with pytest.raises(InputError, match="no such"):
        load_weights(build_unet(TINY), tmp_path / "missing.pt")
    bare = tmp_path / "bare.pt"
    torch.save({"foo.weight": torch.zeros(3)}, bare)
    with pytest.raises(InputError, match="do not fit"):
        load_weights(build_unet(TINY), bare)


def test_bad_inputs_raise_input_error(problem):
    op, x, y = problem
    with pytest.raises(InputError, match="sinogram"):
        fit_dip(y[:-1], op, tiny_config())
    bad = y.clone()
    bad[0, 0] = math.nan
    with pytest.raises(InputError, match="NaN"):
        fit_dip(bad, op, tiny_config())
    with pytest.raises(InputError, match="lr"):
        tiny_config(lr=-1)
    with pytest.raises(InputError, match="net_input"):
        tiny_config(net_input="zeros")


def test_defaults_per_size():
    cfg = DIPConfig.for_image_size(28)
    assert cfg.preset == "reference-28" and cfg.unet_config().scales == 3
    big = DIPConfig.for_image_size(128)
    assert big.preset == "dip-128" and big.unet_config().scales == 5
    assert DIPConfig.preset_defaults("dip-64", iterations=7).iterations == 7
    d = DIPConfig.for_image_size(64).to_dict()
    assert d["unet"]["channels"] == [16, 16, 16, 16]  # docs/dip.md §11
    assert DIPConfig.from_dict(d).unet_config() == DIPConfig.for_image_size(64).unet_config()
    with pytest.raises(InputError, match="unknown"):
        DIPConfig.from_dict({"iterations": 3, "learning_rate": 1e-3})


def test_default_tv_weight_scales_with_noise(problem):
    from ctuq.recon.baselines import rms_column_norm

    op, x, y = problem
    cfg = DIPConfig(unet=TINY, tv_weight_factor=0.5)
    g1 = cfg.resolve_tv_weight(y, op, noise_std=0.1)
    assert g1 == pytest.approx(0.5 * 0.1 * rms_column_norm(op))
    assert cfg.resolve_tv_weight(y, op, noise_std=0.2) == pytest.approx(2 * g1)
    assert cfg.with_(tv_weight=3.0).resolve_tv_weight(y, op) == 3.0
    res = fit_dip(y, op, tiny_config(iterations=2, tv_weight=None, tv_weight_factor=0.5),
                  noise_std=0.1)
    assert res.tv_weight == pytest.approx(g1)


def test_reference_net_fits_a_28px_digit_better_than_fbp():
    op = RayTransform(Geometry.parallel(28, 20), backend="matrix")
    x = torch.as_tensor(digits(1, seed=3)[0])
    y, _ = simulate_sinogram(x, op, 0.05, seed=0)
    res = fit_dip(y, op, DIPConfig.for_image_size(28, iterations=150, lr=5e-3, device="cpu"))
    err_dip = (res.reconstruction - x).square().mean()
    err_fbp = (op.fbp(y) - x).square().mean()
    assert err_dip < err_fbp


def test_mc_dropout_mean_and_std(problem):
    op, x, y = problem
    cfg = tiny_config(iterations=20)
    res = fit_mc_dropout(y, op, cfg, n_samples=24, batch_size=10, keep_samples=True)
    assert res.mean.shape == res.std.shape == (16, 16)
    assert res.samples.shape == (24, 16, 16)
    assert (res.std > 0).any() and torch.isfinite(res.std).all()
    assert torch.allclose(res.mean, res.samples.mean(0), atol=1e-5)
    assert torch.allclose(res.std, res.samples.std(0), atol=1e-5)
    assert res.dip.config.dropout == 0.05
    again = fit_mc_dropout(y, op, cfg, n_samples=24, batch_size=10)
    assert torch.equal(res.mean, again.mean) and torch.equal(res.std, again.std)


def test_mc_dropout_predict_needs_dropout_layers(problem):
    op, x, y = problem
    net = build_unet(TINY)
    with pytest.raises(InputError, match="dropout"):
        mc_dropout_predict(net, torch.zeros(1, 1, 16, 16), 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_on_cuda_matches_cpu(problem, strict_fp32):
    op, x, y = problem
    cpu = fit_dip(y, op, tiny_config(iterations=20, device="cpu"))
    op_gpu = RayTransform(op.geometry, backend="matrix", device="cuda")
    gpu = fit_dip(y, op_gpu, tiny_config(iterations=20, device="cuda"))
    assert gpu.reconstruction.device.type == "cuda"
    # the CUDA step runs as a graph with capturable Adam and other reduction orders; over
    # 20 iterations the round-off grows to ~1e-3 on 0.3-0.4 images (H200, 2026-11-28: up to
    # 1.0e-3 seen, which failed atol=1e-3); a wrong product would be off by far more
    diff = gpu.reconstruction.cpu() - cpu.reconstruction
    assert float(diff.abs().max()) < 5e-3
    assert float(diff.norm() / cpu.reconstruction.norm()) < 5e-3
    mc = fit_mc_dropout(y.cuda(), op_gpu, tiny_config(iterations=5, device="cuda"), n_samples=8)
    assert mc.std.device.type == "cuda"


def _dip_fit(problem, config):
    """A :class:`ctuq.recon.dip._DipFit` set up as :func:`fit_dip` sets it up."""
    from ctuq.recon.dip import _as_sinogram, _DipFit, make_net_input
    op, _, y = problem
    y_t = _as_sinogram(y, op, torch.device("cpu"))
    model = build_unet(config.unet_config(), seed=config.seed, device="cpu")
    model.train()
    net_input = make_net_input(y_t, op, config, "cpu")
    return _DipFit(model, net_input, y_t, None, op, config.tv_weight, config, None, None,
                   "dip", None)


def test_sync_free_step_keeps_the_same_books_as_the_plain_loop(problem):
    # the step that the CUDA graph captures, run eagerly on the CPU: its on-device
    # bookkeeping (history, best loss/iteration/weights/output) must match the plain loop
    # a constant, large learning rate: the loss jumps up and down to the end (under the
    # cosine schedule the last iterate can be the best, and then "best" is just "last")
    cfg = tiny_config(unet=UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2),
                                      use_norm=True), iterations=25, lr=0.3,
                      lr_schedule="constant", progress_every=7)
    torch.manual_seed(1)
    plain = _dip_fit(problem, cfg).run_plain()
    torch.manual_seed(1)
    free = _dip_fit(problem, cfg).run_graphed(graph=False)
    np.testing.assert_array_equal(free[0], plain[0])
    assert free[1:3] == plain[1:3]
    # the loss was not monotone: the bookkeeping had worse iterates to pass over
    assert np.any(np.diff(plain[0][0]) > 0) and plain[2] > 0
    assert free[3].keys() == plain[3].keys()
    for k in plain[3]:
        assert torch.equal(free[3][k], plain[3][k]), k
    assert torch.equal(free[4], plain[4])


def test_sync_free_step_stops_at_a_non_finite_loss_like_the_plain_loop(problem):
    op, x, y = problem
    huge = (op, x, np.full_like(np.asarray(y), 1e30))  # squares overflow float32
    cfg = tiny_config(iterations=5, progress_every=1)
    for run in (_dip_fit(huge, cfg).run_plain(), _dip_fit(huge, cfg).run_graphed(graph=False)):
        hist, best_loss, best_iter, state, out = run
        assert hist.shape == (3, 1) and not np.isfinite(hist[0, 0])
        assert (best_iter, state, out) == (-1, None, None) and best_loss == math.inf


def test_group_norm_from_var_mean_matches_torch_in_both_ad_modes():
    from ctuq.models.unet import group_norm_var_mean
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 5, 6, generator=gen, dtype=torch.float64)
    w, b = torch.randn(8, generator=gen, dtype=torch.float64), torch.randn(
        8, generator=gen, dtype=torch.float64)
    t = torch.randn_like(x)
    for groups in (1, 2, 4):
        ref = lambda z: torch.nn.functional.group_norm(z, groups, w, b, 1e-5)  # noqa: E731
        ours = lambda z: group_norm_var_mean(z, groups, w, b, 1e-5)  # noqa: E731
        torch.testing.assert_close(ours(x), ref(x))
        torch.testing.assert_close(torch.func.jvp(ours, (x,), (t,))[1],
                                   torch.func.jvp(ref, (x,), (t,))[1])
        torch.testing.assert_close(torch.func.vjp(ours, x)[1](t)[0],
                                   torch.func.vjp(ref, x)[1](t)[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_fit_matches_the_plain_loop(problem, caplog):
    op, x, y = problem
    op_gpu = RayTransform(op.geometry, backend="matrix", device="cuda")
    cfg = tiny_config(unet=UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2),
                                      use_norm=True), iterations=40, device="cuda",
                      progress_every=5)
    with caplog.at_level("WARNING", logger="ctuq.recon.dip"):
        graphed = fit_dip(y, op_gpu, cfg)
    assert "capture failed" not in caplog.text
    plain = fit_dip(y, op_gpu, cfg.with_(cuda_graph=False))
    np.testing.assert_allclose(graphed.loss_history["loss"], plain.loss_history["loss"],
                               rtol=2e-3)
    assert abs(graphed.best_iteration - plain.best_iteration) <= 2
    torch.testing.assert_close(graphed.reconstruction, plain.reconstruction, atol=2e-3,
                               rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_group_norm_on_cuda_matches_the_cpu_kernel():
    from ctuq.models.unet import GroupNorm
    norm = GroupNorm(2, 8)
    torch.nn.init.normal_(norm.weight), torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 8, 64, 64)
    torch.testing.assert_close(norm.cuda()(x.cuda()).cpu(), norm.cpu()(x), atol=1e-5, rtol=1e-5)


def test_tv_input_is_the_tv_reconstruction_at_its_default_weight(problem):
    from ctuq.recon.baselines import tv_reconstruction
    from ctuq.recon.dip import make_net_input

    op, x, y = problem
    y = torch.as_tensor(y)
    cfg = tiny_config(net_input="tv")
    got = make_net_input(y, op, cfg, "cpu", noise_std=0.05)
    want = tv_reconstruction(y, op, noise_std=0.05)
    assert got.shape == (1, 1, *op.geometry.image_shape)
    assert torch.equal(got[0, 0], want.float())
    # a cleaner input than the FBP: nearer the truth
    fbp = make_net_input(y, op, tiny_config(net_input="fbp"), "cpu")
    truth = torch.as_tensor(x, dtype=torch.float32)
    assert (got[0, 0] - truth).norm() < (fbp[0, 0] - truth).norm()
    res = fit_dip(y, op, cfg.with_(iterations=5), noise_std=0.05)
    assert torch.equal(res.net_input, got)

