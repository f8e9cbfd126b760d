"""The DIP loop's weights over two buffers: the same numbers as torch's per-tensor step."""

import pytest
import torch

from ctuq.models.unet import UNetConfig, build_unet
from ctuq.recon.flat_parameters import FlatParameters


def _unet(seed=0):
    return build_unet(UNetConfig(scales=2, channels=(8, 8), skip_channels=(0, 2),
                                 use_norm=True), seed=seed)


def test_flat_step_equals_torchs_per_tensor_step_bit_for_bit_with_and_without_clipping():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 1, 16, 16, generator=gen)
    target = torch.randn(1, 1, 16, 16, generator=gen)
    ref, model = _unet(), _unet()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.05, foreach=True)
    flat = FlatParameters(model)
    opt = torch.optim.Adam(flat.parameters(), lr=0.05)
    clipped = []
    for step in range(12):
        scale = 50.0 if step % 3 == 0 else 1e-3  # some steps above the clip norm, some below
        ref_opt.zero_grad(set_to_none=True)
        (scale * ((ref(x) - target) ** 2).sum()).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm=1.0)
        ref_opt.step()
        flat.zero_grad()
        (scale * ((model(x) - target) ** 2).sum()).backward()
        norm = flat.clip_grad_norm_(1.0)
        opt.step()
        assert torch.equal(norm, ref_norm)
        clipped.append(float(norm) > 1.0)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p, q), (step, name)
    assert any(clipped) and not all(clipped)


def test_flat_parameters_are_views_until_released_and_state_dict_copies():
    model = _unet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flat = FlatParameters(model)
    assert flat.weights.numel() == sum(p.numel() for p in model.parameters())
    for name, p in model.named_parameters():  # the values kept, now views of the buffer
        assert torch.equal(p, before[name])
        assert p.untyped_storage().data_ptr() == flat.weights.untyped_storage().data_ptr()
    saved = flat.state_dict()
    assert list(saved) == list(before)
    with torch.no_grad():
        flat.weights.add_(1.0)
    assert all(torch.equal(saved[k], before[k]) for k in saved)  # a copy, not a view
    flat.release()
    after = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        flat.weights.zero_()
    for name, p in model.named_parameters():
        assert p.grad is None
        assert torch.equal(p, after[name])  # independent of the buffer now
        assert torch.equal(p, before[name] + 1)


def test_flat_parameters_refuse_mixed_dtypes():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1).double())
    with pytest.raises(ValueError, match="one dtype"):
        FlatParameters(model)
