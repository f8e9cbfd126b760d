"""The continued DIP fit at 30 angles / 1 % noise, validation split (docs/speed.md).

Fits, per scan: the reference (1,000 iterations from the seeded start), the
held-out fit (kept angles), and four continuations of it on all angles for
half the iterations on the tail of the schedule: with the FBP of all angles
as input (what ctuq does), with the held-out fit's own input, the same with
50 warm-up steps, and the same at a tenth of the rate. Prints one JSON line
per scan; writes benchmarks/results/continued_fit_low_noise_validation_64.json.

    python scripts/diag_continued_fit.py
"""
import json, sys, time, numpy as np, torch
torch.set_num_threads(2)
from ctuq.bench.cases import _case, simulate
from ctuq.recon.dip import DIPConfig, fit_dip
from ctuq.recon.model_error.heldout import heldout_fit
from ctuq.recon.model_error.shared import continued_config
from ctuq.recon.scaling import data_scale
from skimage.metrics import peak_signal_noise_ratio as psnr

out = []
for fam, idx in [("digits", 0), ("rectangles", 0), ("ellipses", 0)]:
    sc = simulate(_case("validation", fam, idx, 64, 30, 0.01))
    y = torch.as_tensor(np.asarray(sc.y), dtype=torch.float32)
    s = data_scale(y, sc.op)
    y = y / s
    truth = np.asarray(sc.truth) / s
    sigma = float(sc.sigma) / s
    cfg = DIPConfig.for_image_size((64, 64), progress_every=10**6)
    P = lambda r: psnr(truth, r.reconstruction.detach().numpy().reshape(64, 64), data_range=truth.max() - truth.min())
    row = {"case": f"{fam}/{idx}"}
    ref = fit_dip(y, sc.op, cfg, noise_std=sigma); row["reference"] = P(ref)
    mask, held = heldout_fit(y, sc.op, cfg, every=6, min_out=7, noise_std=sigma)
    row["heldout_fit_on_kept"] = P(held)
    tail = continued_config(cfg, 0.5)
    a = fit_dip(y, sc.op, tail, noise_std=sigma, init_state=held.state_dict); row["tail_new_input"] = P(a)
    b = fit_dip(y, sc.op, tail, noise_std=sigma, init_state=held.state_dict, net_input=held.net_input); row["tail_same_input"] = P(b)
    c = fit_dip(y, sc.op, tail.with_(warmup=50), noise_std=sigma, init_state=held.state_dict, net_input=held.net_input); row["tail_same_input_warmup50"] = P(c)
    d = fit_dip(y, sc.op, tail.with_(lr=tail.lr * 0.1), noise_std=sigma, init_state=held.state_dict, net_input=held.net_input); row["tail_same_input_lr0.1x"] = P(d)
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    out.append(row)
json.dump(out, open("benchmarks/results/continued_fit_low_noise_validation_64.json", "w"), indent=1)
