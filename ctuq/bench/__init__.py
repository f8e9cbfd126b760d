"""Benchmarks of ctuq on its own product path: cases, scores, runs, reports.

The benchmark command lines are thin wrappers over these modules; every CT
benchmark of ctuq's own methods reconstructs through ``ctuq.reconstruct``
(or the stage functions it runs) and scores the result with
:mod:`ctuq.bench.scores`.

- :mod:`ctuq.bench.cases`: the case lists (split, family, condition) and the
  simulation of a case's scan;
- :mod:`ctuq.bench.scores`: one set of scoring functions (coverage overall,
  on and off edges; log-likelihood; Spearman; PSNR/SSIM; reliability);
- :mod:`ctuq.bench.runner`: the resumable runner (a JSON-lines ``--partial``
  file, process pool, resume) and JSON cleaning/writing;
- :mod:`ctuq.bench.machine`: the machine's description, timing, peak memory;
- :mod:`ctuq.bench.calibration`: the calibration benchmark;
- :mod:`ctuq.bench.tuning`: tuning of the held-out model error on stored runs;
- :mod:`ctuq.bench.dip_vs_tv`, :mod:`ctuq.bench.scaling`: DIP against TV;
  time and memory against the image size;
- :mod:`ctuq.bench.report`: markdown results pages written from the JSON;
- :mod:`ctuq.bench.toy`: a small seeded CT problem (tests, sampling benchmark).

Nothing in ctuq imports this package; it may import ``ctuq.recon``,
``ctuq.classify``, ``ctuq.posterior``, ``ctuq.data`` and ``ctuq.models``.
"""
