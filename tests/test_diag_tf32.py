"""scripts/diag_tf32_products.py: its TF32 emulation rounds what it says and nothing else."""

import pytest
import torch
from torch.func import jvp, vjp, vmap

from ctuq.models.unet import build_unet
from ctuq.posterior.linearize import Linearization

from conftest import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def script():
    return load_script("diag_tf32_products")


@pytest.mark.parametrize("bits", [10, 8])
def test_round_mantissa_keeps_bits_and_relative_error_half_an_ulp(script, bits):
    x = torch.randn(10_000) * torch.logspace(-20, 20, 10_000)
    r = script.round_mantissa(x, bits)
    assert float(((r - x) / x).abs().max()) <= 2.0 ** -(bits + 1) * (1 + 1e-6)
    dropped = r.view(torch.int32) & ((1 << (23 - bits)) - 1)
    assert int(dropped.abs().max()) == 0
    assert torch.equal(script.round_mantissa(r, bits), r)  # idempotent
    assert torch.equal(script.round_mantissa(x, 23), x)


def test_rounding_function_rounds_primal_tangent_and_cotangent_under_vmap(script):
    rnd = script.rounding_function(10)
    x, t = torch.randn(5, 7), torch.randn(5, 7)
    out, tangent = jvp(rnd.apply, (x,), (t,))
    assert torch.equal(out, script.round_mantissa(x, 10))
    assert torch.equal(tangent, script.round_mantissa(t, 10))
    _, back = vjp(rnd.apply, x)
    assert torch.equal(back(t)[0], script.round_mantissa(t, 10))
    batched = vmap(lambda ti: jvp(rnd.apply, (x,), (ti,))[1])(torch.stack([t, 2 * t]))
    assert torch.equal(batched[1], script.round_mantissa(2 * t, 10))


def test_rounded_operands_perturb_products_only_inside_the_block(script):
    net = build_unet("reference-28", channels=(4, 4, 4)).eval()
    inp = torch.rand(1, 1, 28, 28)
    exact = Linearization(net, inp)
    v = torch.randn(2, exact.num_params)
    want = exact.jvp(v)
    with script.rounded_operands(10):  # the hooks go on the network itself
        got = Linearization(net, inp).jvp(v)
    err = float((got - want).norm() / want.norm())
    assert 1e-5 < err < 5e-2  # TF32-sized (a few 1e-3 on this untrained net), not float32
    after = Linearization(net, inp)  # hooks and constructor restored
    assert torch.equal(after.jvp(v), want)
