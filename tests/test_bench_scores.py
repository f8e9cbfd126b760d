"""ctuq.bench.scores and ctuq.bench.machine: the benchmarks' scores and measurements."""

import math
import mmap
import time

import numpy as np
import pytest
import torch

from ctuq.bench import scores
from ctuq.bench.machine import PeakMemory, machine, median_s
from ctuq.data.phantoms import make_phantom
from ctuq.recon import predictive


@pytest.fixture
def image():
    gen = np.random.default_rng(0)
    truth = make_phantom("ellipses", 32, 1).astype(np.float64)
    mean = truth + gen.normal(0, 0.03, truth.shape)
    std = gen.uniform(0.01, 0.05, truth.shape)
    return truth, mean, std


def test_score_agrees_with_the_predictive_metrics_and_splits_edges(image):
    truth, mean, std = image
    s = scores.score(truth, mean, std)
    cov = predictive.coverage(truth, mean, std)
    assert [s[f"coverage_{k}"] for k in (1, 2, 3)] == pytest.approx([cov[1], cov[2], cov[3]])
    assert s["pixel_log_likelihood"] == pytest.approx(
        predictive.pixel_log_likelihood(truth, mean, std), rel=1e-12)
    assert s["psnr"] == predictive.psnr(truth, mean) and s["ssim"] == predictive.ssim(truth, mean)
    # edges and off edges partition the image
    e = s["edge_fraction"]
    assert 0 < e < 1
    for k in (1, 2, 3):
        assert s[f"coverage_{k}"] == pytest.approx(
            e * s[f"coverage_{k}_edges"] + (1 - e) * s[f"coverage_{k}_off_edges"], abs=1e-12)
    rel = s["reliability"]
    assert len(rel) == len(scores.LEVELS) and all(b >= a for a, b in zip(rel, rel[1:]))


def test_a_zero_std_is_scored_without_a_floor(image):
    truth, mean, std = image
    std = std.copy()
    std[0, 0] = 0.0
    mean = mean.copy()
    mean[0, 0] = truth[0, 0] + 0.1  # wrong, and certain of it
    s = scores.score(truth, mean, std)
    # not a number (JSON null): the mean over images then leaves this image out
    assert not math.isfinite(s["pixel_log_likelihood"])
    inside = np.abs(truth - mean) <= std
    assert not inside[0, 0] and s["coverage_1"] == pytest.approx(float(inside.mean()))
    q = scores.sample_scores(truth, mean, std, floor=1e-6)
    assert q["zero_std_fraction"] == pytest.approx(1 / truth.size) and math.isfinite(q["ll"])
    live = std > 0
    assert q["coverage2_nonzero_std"] == pytest.approx(
        float((np.abs(truth - mean)[live] <= 2 * std[live]).mean()))


def test_quality_uses_the_variance_and_clamps_negative_round_off(image):
    truth, mean, std = image
    var = torch.as_tensor(std**2)
    q = scores.quality(truth, mean, var)
    assert q["mean_std"] == pytest.approx(float(std.mean()))
    assert q["test_ll"] == pytest.approx(predictive.pixel_log_likelihood(truth, mean, std))
    var[0, 0] = -1e-20  # round-off of an exact variance: a zero std there, scored with a floor
    clamped = scores.quality(truth, mean, var, floor=1e-6)
    assert clamped["mean_std"] == pytest.approx(q["mean_std"] - std[0, 0] / truth.size)


def test_summarise_images_skips_missing_scores():
    rows = [{"a": 1.0}, {"a": 3.0}, {"a": None}]
    assert scores.summarise_images(rows, ["a"]) == {"images": 3, "a_mean": 2.0, "a_worst": 1.0}


def test_peak_memory_sees_an_allocation_inside_the_block():
    with PeakMemory("cpu", interval=0.001) as mem:
        # 64 MiB of fresh pages, touched: an anonymous map, since in a long-lived process
        # (a pytest worker past 1.7 GB) malloc may serve np.ones from freed heap pages
        # that are resident already, and the RSS does not move
        buf = mmap.mmap(-1, 64 * 2**20)
        block = np.frombuffer(buf, dtype=np.uint8)
        block[:] = 1
        # held until the poller has run: on a busy machine its thread may not get a
        # time slice in the few ms the block would otherwise live (a broken poller
        # still fails, after 5 s)
        deadline = time.monotonic() + 5.0
        while mem.peak - mem.base < 48 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.005)
        del block
        buf.close()
    assert mem.kind == "process RSS" and mem.peak_bytes - mem.base >= 48 * 2**20
    m = machine("cpu")
    assert m["cpu_count"] >= 1 and m["device"] == "cpu" and m["torch"] == torch.__version__
    assert median_s(lambda: None, 3) >= 0


def test_speed_probe_times_each_kind_of_work_with_the_current_threads():
    import math

    from ctuq.bench.machine import speed_probe

    before = torch.get_num_threads()
    state = torch.get_rng_state()
    try:
        torch.set_num_threads(1)
        probe = speed_probe(repeats=2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(torch.get_rng_state(), state)  # a benchmark's seeded draws unmoved
    assert probe["threads"] == 1
    figures = {k: v for k, v in probe.items() if k != "threads"}
    assert set(figures) == {"matmul_gflops", "conv_ms", "op_overhead_us", "copy_gb_s",
                            "python_ns", "unet_step_ms"}
    assert all(math.isfinite(v) and v > 0 for v in figures.values())
    # a kernel launch costs less than a 64² convolution's forward and backward
    assert probe["op_overhead_us"] < 1e3 * probe["conv_ms"]
    # a U-net step is made of many such convolutions
    assert probe["conv_ms"] < probe["unet_step_ms"]
