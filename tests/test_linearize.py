"""The Jacobian operator: dense J against JVP / VJP products, blocks, adjointness."""


import pytest
import torch

from ctuq.errors import InputError
from ctuq.models.unet import build_unet
from ctuq.posterior import linearize
from ctuq.posterior.linearize import Linearization, auto_chunk_size, select_parameters

from conftest import requires_cuda

# torch registers its forward-mode decompositions through torch.jit.script on first use
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")]


@pytest.fixture(scope="module")
def J64(lin):
    return lin.dense(torch.float64)


def _rel(a, b):
    return float((a - b).norm() / b.norm())


def test_blocks_follow_the_unet_and_cover_the_vector(problem, lin):
    blocks = problem.model.blocks()
    assert list(lin.blocks) == list(blocks)
    start = 0
    params = dict(problem.model.named_parameters())
    for name, sl in lin.block_slices.items():
        assert sl.start == start
        names = [n for n, _ in blocks[name]]
        assert [s.name for s in lin.blocks[name].segments] == names
        assert sl.stop - sl.start == sum(params[n].numel() for n in names)
        start = sl.stop
    assert start == lin.num_params
    # theta_hat is the conv weights, in order
    flat = torch.cat([params[n].reshape(-1) for n in problem.model.conv_weight_names()])
    assert torch.equal(lin.theta_hat, flat)
    assert lin.block_sizes()["out"] == params["out.weight"].numel()


def test_x_hat_and_linear_model_at_theta_hat(problem, lin):
    with torch.no_grad():
        out = problem.model(problem.net_input)[0, 0]
    assert torch.allclose(lin.x_hat, out)
    assert torch.allclose(lin.linear_model(lin.theta_hat), out)
    assert tuple(lin.image_shape) == (28, 28)


def test_dense_jacobian_equals_jvp_and_vjp(lin, J64):
    # float32 products against the float64 dense J: round-off ~1e-6 relative
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(5, lin.num_params, generator=gen)
    u = torch.randn(4, 28, 28, generator=gen)
    jv = lin.jvp(v).double().reshape(5, -1)
    jtu = lin.vjp(u).double()
    assert jv.shape == (5, 784) and jtu.shape == (4, lin.num_params)
    assert _rel(jv, v.double() @ J64.t()) < 1e-5
    assert _rel(jtu, u.double().reshape(4, -1) @ J64) < 1e-5
    # single vectors keep their shape
    assert lin.jvp(v[0]).shape == (28, 28)
    assert lin.vjp(u[0]).shape == (lin.num_params,)
    # the float32 dense J agrees with the float64 one
    assert _rel(lin.dense().double(), J64) < 1e-5


def test_float64_products_equal_the_float64_jacobian(lin, J64):
    """``dtype=torch.float64`` recomputes the network in double precision: the products
    agree with the float64 dense J to float64 round-off, far below float32's."""
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(3, lin.num_params, generator=gen, dtype=torch.float64)
    u = torch.randn(2, 28, 28, generator=gen, dtype=torch.float64)
    jv = lin.jvp(v, torch.float64).reshape(3, -1)
    jtu = lin.vjp(u, torch.float64)
    assert jv.dtype == torch.float64 and jtu.dtype == torch.float64
    assert _rel(jv, v @ J64.t()) < 1e-12
    assert _rel(jtu, u.reshape(2, -1) @ J64) < 1e-12
    assert lin.jvp(v[0], torch.float64).shape == (28, 28)
    # without the dtype a float64 vector is computed in float32, as before
    assert lin.jvp(v).dtype == torch.float32


def test_jvp_is_the_derivative(lin):
    # f(θ̃ + h v) − f(θ̃) − h J v = O(h²) where f is smooth: the ratio of remainders at
    # h and h/2 is ≈ 4. Two places are not smooth: LeakyReLU kinks, and the ±9
    # pre-sigmoid clamp, where f is locally constant but the Jacobian passes the
    # gradient straight through (sigmoid'(±9) times the pre-activation's). So h is
    # halved until the step crosses no kink and no clamp edge, the remainder is
    # checked on the unclamped pixels, and the clamped ones against sigmoid'(±9).
    v = torch.randn(lin.num_params, generator=torch.Generator().manual_seed(1)).double()
    lin64 = lin  # products in float64 through the functional call
    theta = lin.theta_hat.double()
    fixed = {k: t.double() for k, t in lin._fixed.items()}
    inp = lin.net_input.double()
    kinks = [m for m in lin.model.modules() if isinstance(m, torch.nn.LeakyReLU)]
    assert kinks, "the toy U-net has LeakyReLU activations"

    def f(th, pre=False):
        return torch.func.functional_call(lin.model, lin._params_from(th, fixed), (inp,),
                                          {"return_pre_sigmoid": pre}).reshape(28, 28)

    def pattern(th):  # LeakyReLU signs and the clamped pixels at th
        seen = []
        hooks = [m.register_forward_hook(lambda m, a, o: seen.append(a[0] > 0)) for m in kinks]
        try:
            pre = f(th, pre=True)
        finally:
            for hk in hooks:
                hk.remove()
        return seen + [pre.abs() >= 9.0]

    base = pattern(theta)
    clamped = base[-1]
    assert 0 < int(clamped.sum()) < clamped.numel(), "the toy fit has clamped and free pixels"
    h = 1e-3
    while not all(torch.equal(a, b) for a, b in zip(base, pattern(theta + h * v))):
        h /= 2
    assert h > 1e-6, "no kink-free step found"
    jv = torch.func.jvp(f, (theta,), (v,))[1]
    rem = [float((f(theta + s * v) - f(theta) - s * jv)[~clamped].norm()) for s in (h, h / 2)]
    assert 3.0 < rem[0] / rem[1] < 5.0
    # clamped pixels: f does not move, the JVP is the straight-through sigmoid'(±9) (J_pre v)
    assert torch.equal(f(theta + h * v)[clamped], f(theta)[clamped])
    jv_pre = torch.func.jvp(lambda th: f(th, pre=True), (theta,), (v,))[1]
    slope = torch.sigmoid(torch.tensor(9.0, dtype=torch.float64)) * torch.sigmoid(
        torch.tensor(-9.0, dtype=torch.float64))
    assert torch.allclose(jv[clamped], slope * jv_pre[clamped], rtol=1e-10, atol=0)
    # and the float32 operator agrees with the float64 JVP
    assert _rel(lin64.jvp(v.float()).double(), jv) < 1e-5


def test_chunking_and_loop_fallback_agree(problem, lin):
    v = torch.randn(7, lin.num_params, generator=torch.Generator().manual_seed(3))
    u = torch.randn(7, 28, 28, generator=torch.Generator().manual_seed(4))
    ref_j, ref_t = lin.jvp(v), lin.vjp(u)
    chunked = Linearization(problem.model, problem.net_input, chunk_size=3)
    looped = Linearization(problem.model, problem.net_input, vectorize=False)
    for other in (chunked, looped):
        assert torch.allclose(other.jvp(v), ref_j, atol=1e-6, rtol=1e-5)
        assert torch.allclose(other.vjp(u), ref_t, atol=1e-6, rtol=1e-5)
    assert lin.jvp(v[:0]).shape == (0, 28, 28)


def test_auto_chunk_size_bounds_the_batched_activations(problem, lin, monkeypatch):
    act = lin.activation_numel()
    # an independent count: every leaf module's output of one forward pass
    sizes = []
    hooks = [m.register_forward_hook(lambda m, i, o: sizes.append(o.numel()))
             for m in problem.model.modules() if not list(m.children())]
    with torch.no_grad():
        problem.model(problem.net_input)
    for h in hooks:
        h.remove()
    assert act == sum(sizes)
    assert lin.chunk_size == auto_chunk_size(act, "cpu") == linearize.CPU_CHUNK_ELEMENTS // act
    assert auto_chunk_size(10 * linearize.CPU_CHUNK_ELEMENTS, "cpu") == 1
    # a budget of 2.5 activations gives chunks of 2, with the products unchanged
    monkeypatch.setattr(linearize, "CPU_CHUNK_ELEMENTS", int(2.5 * act))
    small = Linearization(problem.model, problem.net_input)
    assert small.chunk_size == 2
    v = torch.randn(5, lin.num_params, generator=torch.Generator().manual_seed(5))
    u = torch.randn(5, 28, 28, generator=torch.Generator().manual_seed(6))
    whole = Linearization(problem.model, problem.net_input, chunk_size=None)
    assert whole.chunk_size is None
    # the same sums in another order: float32 rounding relative to the largest entry
    # (a chunking error would be of the entries' own size)
    for a, b in ((small.jvp(v), whole.jvp(v)), (small.vjp(u), whole.vjp(u))):
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())
    for bad in (0, -2, "big", [4], 2.5, True):
        with pytest.raises(InputError, match="chunk_size"):
            Linearization(problem.model, problem.net_input, chunk_size=bad)


def test_parameter_filters(problem):
    model = problem.model
    conv = select_parameters(model, "conv")
    assert "inc.0.conv.bias" in conv["inc"] and "inc.0.conv.weight" in conv["inc"]
    weights = select_parameters(model, "conv_weights")
    assert all(n.endswith(".weight") for names in weights.values() for n in names)
    lin_b = Linearization(model, problem.net_input, param_filter="conv")
    n_bias = sum(m.bias.numel() for blk in model.blocks().values() for _, m in blk)
    assert lin_b.num_params == Linearization(model, problem.net_input).num_params + n_bias
    only_out = select_parameters(model, lambda n, p: n.startswith("out."))
    assert list(only_out) == ["out"]
    with pytest.raises(InputError):
        select_parameters(model, "biases")
    with pytest.raises(InputError):
        select_parameters(model, lambda n, p: False)


def test_generic_module_without_blocks():
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Tanh(),
                              torch.nn.Conv2d(2, 1, 1))
    lin = Linearization(net, torch.rand(1, 1, 6, 6), param_filter="all")
    assert list(lin.blocks) == ["0", "2"]
    assert lin.num_params == sum(p.numel() for p in net.parameters())
    J = lin.dense(torch.float64)
    v = torch.randn(2, lin.num_params)
    assert _rel(lin.jvp(v).double().reshape(2, -1), v.double() @ J.t()) < 1e-5


def _linearization_on_cuda(problem):
    model = build_unet("reference-28", channels=(4, 4, 4))
    model.load_state_dict(problem.model.state_dict())
    return Linearization(model.cuda(), problem.net_input.cuda())


@pytest.mark.gpu
@requires_cuda
def test_cuda_matches_cpu(problem, lin, strict_fp32):
    lin_c = _linearization_on_cuda(problem)
    v = torch.randn(3, lin.num_params)
    assert torch.allclose(lin_c.jvp(v.cuda()).cpu(), lin.jvp(v), atol=1e-4, rtol=1e-3)


@pytest.fixture
def tf32_on():
    """torch's default on Ampere and later GPUs for cuDNN (TF32 convolutions), both flags on."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def test_full_float32_turns_tf32_off_on_cuda_only_and_restores_it(tf32_on):
    flags = lambda: (torch.backends.cudnn.allow_tf32,  # noqa: E731
                     torch.backends.cuda.matmul.allow_tf32)
    with linearize.full_float32("cuda"):
        assert flags() == (False, False)
    assert flags() == (True, True)
    with pytest.raises(ValueError), linearize.full_float32(torch.device("cuda", 0)):
        assert flags() == (False, False)
        raise ValueError("an error inside the block")
    assert flags() == (True, True)
    with linearize.full_float32("cpu"):  # the CPU has no TF32: nothing to touch
        assert flags() == (True, True)


def test_every_product_runs_in_full_float32(problem, lin, monkeypatch):
    import contextlib
    entered = []

    @contextlib.contextmanager
    def record(device):
        entered.append(torch.device(device))
        yield

    monkeypatch.setattr(linearize, "full_float32", record)
    v = torch.randn(2, lin.num_params)
    calls = {"jvp": lambda: lin.jvp(v), "vjp": lambda: lin.vjp(lin.x_hat.expand(2, -1, -1)),
             "linear_model": lambda: lin.linear_model(lin.theta_hat),
             "dense": lambda: lin.dense(chunk_size=512)}
    for name, call in calls.items():
        entered.clear()
        call()
        assert entered and all(d == lin.device for d in entered), name
    # the constructor's forward pass (x̂) as well
    entered.clear()
    Linearization(problem.model, problem.net_input)
    assert entered


@pytest.mark.gpu
@requires_cuda
def test_products_on_cuda_ignore_a_global_tf32(problem, lin, tf32_on):
    # with TF32 left on, J and Jᵀ on the GPU must still be the CPU's to float32 accuracy
    # (TF32 made them differ by ~1e-3 relative, the CG tolerance: docs/scaling.md §5c)
    lin_c = _linearization_on_cuda(problem)
    v = torch.randn(3, lin.num_params)
    normal_cpu = lin.vjp(lin.jvp(v))
    normal_gpu = lin_c.vjp(lin_c.jvp(v.cuda())).cpu()
    assert _rel(normal_gpu, normal_cpu) < 1e-4
    assert torch.backends.cudnn.allow_tf32  # the global flag is the user's again
