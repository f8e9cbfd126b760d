"""The DIP U-net: reference parameter count, presets, blocks, dropout, seeding."""

import pytest
import torch
from torch import nn

from ctuq.errors import InputError
from ctuq.models.unet import (
    PRESETS,
    UNet,
    UNetConfig,
    build_unet,
    count_parameters,
    preset_name_for_size,
    unet_preset,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_reference_28_has_the_reference_parameter_count():
    net = build_unet("reference-28")
    assert count_parameters(net) == 76_905
    cfg = net.config
    assert (cfg.scales, cfg.channels, cfg.skip_channels) == (3, (32, 32, 32), (0, 4, 4))
    assert cfg.use_sigmoid and not cfg.use_norm and cfg.dropout == 0


def test_reference_28_layer_shapes():
    net = build_unet("reference-28")
    shapes = {n: tuple(p.shape) for n, p in net.named_parameters() if n.endswith("weight")}
    # in-block: a single 3×3 conv; up blocks take 32 + 4 skip channels
    assert shapes["inc.0.conv.weight"] == (32, 1, 3, 3)
    assert shapes["down.0.0.conv.weight"] == (32, 32, 3, 3)
    assert shapes["up.0.skip.conv.weight"] == (4, 32, 1, 1)
    assert shapes["up.1.conv.0.conv.weight"] == (32, 36, 3, 3)
    assert shapes["out.weight"] == (1, 32, 1, 1)


@pytest.mark.parametrize("name,size", [("reference-28", 28), ("dip-64", 64),
                                       ("dip-128", 128), ("dip-256", 256),
                                       pytest.param("dip-512", 512, marks=pytest.mark.slow)])
def test_presets_build_and_run_forward_on_their_size(name, size):
    assert preset_name_for_size(size) == name
    net = build_unet(unet_preset(size)).eval()
    with torch.no_grad():
        out = net(torch.rand(1, 1, size, size))
    assert out.shape == (1, 1, size, size)
    assert torch.isfinite(out).all()
    if net.config.use_sigmoid:
        assert (out > 0).all() and (out < 1).all()


def test_reference_large_preset_builds_with_groupnorm():
    cfg = PRESETS["reference-large"]
    # build a narrow copy (the real one has ~3 M parameters): same structure, norms on
    net = UNet(cfg.with_(channels=(8,) * cfg.scales))
    assert any(isinstance(m, nn.GroupNorm) for m in net.modules())
    out = net(torch.rand(1, 1, 40, 40))
    assert out.shape == (1, 1, 40, 40)
    # up blocks with skip width 0 have no skip conv
    assert [b.skip is not None for b in net.up] == [True, True, False, False, False]


@pytest.mark.parametrize("shape", [(27, 31), (13, 13), (1, 1)])
def test_odd_sizes_keep_the_shape(shape):
    net = build_unet("reference-28")
    assert net(torch.rand(2, 1, *shape)).shape == (2, 1, *shape)


def test_blocks_cover_every_conv_once_in_forward_order():
    net = build_unet("dip-64")
    blocks = net.blocks()
    assert list(blocks) == ["inc", "down_0", "down_1", "down_2", "skip_0", "up_0",
                            "skip_1", "up_1", "skip_2", "up_2", "out"]
    params = dict(net.named_parameters())
    seen = []
    for name, entries in blocks.items():
        for pname, conv in entries:
            assert isinstance(conv, nn.Conv2d)
            assert params[pname] is conv.weight
            seen.append(conv)
        kernel = {tuple(c.kernel_size) for _, c in entries}
        assert kernel == ({(1, 1)} if name.startswith(("skip", "out")) else {(3, 3)})
    all_convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(seen) == len(all_convs) == len(set(map(id, seen)))
    assert len(blocks["inc"]) == 1 and all(len(blocks[f"up_{i}"]) == 2 for i in range(3))
    assert net.conv_weight_names()[0] == "inc.0.conv.weight"


def test_dropout_option_is_stochastic_and_keeps_the_state_dict_layout():
    plain = build_unet("reference-28", seed=3)
    drop = build_unet("reference-28", seed=3, dropout=0.3)
    assert plain.state_dict().keys() == drop.state_dict().keys()
    n_dropout = sum(isinstance(m, nn.Dropout2d) for m in drop.modules())
    n_conv3 = sum(isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3) for m in drop.modules())
    assert n_dropout == n_conv3 == 9
    x = torch.rand(1, 1, 28, 28)
    drop.train()
    assert not torch.equal(drop(x), drop(x))
    drop.eval()
    assert torch.allclose(drop(x), plain(x))


def test_build_unet_is_seeded_and_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = build_unet(seed=1), build_unet(seed=1), build_unet(seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    wa, wb, wc = (n.inc[0].conv.weight for n in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_sigmoid_off_and_pre_sigmoid_clamp():
    x = torch.rand(1, 1, 16, 16)
    net = build_unet(UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2)))
    with torch.no_grad():
        net.out.bias.fill_(50.0)
        pre = net(x, return_pre_sigmoid=True)
    assert pre.max() <= 9.0
    # the clamp passes gradients through, so a saturated network can still learn
    net(x).sum().backward()
    assert net.out.bias.grad.abs().item() > 0
    lin = build_unet(UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2),
                                use_sigmoid=False))
    with torch.no_grad():
        lin.out.bias.fill_(50.0)
        assert lin(x).min() > 20


def test_bad_configs_raise_input_error():
    with pytest.raises(InputError, match="channels"):
        UNetConfig(scales=3, channels=(32, 32))
    with pytest.raises(InputError, match="skip_channels"):
        UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, -1))
    with pytest.raises(InputError, match="dropout"):
        UNetConfig(dropout=1.5)
    with pytest.raises(InputError, match="preset"):
        unet_preset("nope")
    with pytest.raises(InputError, match="unknown"):
        UNetConfig.from_dict({"scales": 3, "width": 4})
    assert UNetConfig.from_dict(UNetConfig().to_dict()) == UNetConfig()


def test_size_mapping():
    assert [preset_name_for_size(n) for n in (8, 28, 37, 48, 64, 100, 200, 341, 342, 512,
                                              2048)] == [
        "reference-28", "reference-28", "reference-28", "dip-64", "dip-64", "dip-128",
        "dip-256", "dip-256", "dip-512", "dip-512", "dip-512"]
    assert preset_name_for_size((28, 60)) == "dip-64"
