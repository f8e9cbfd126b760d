"""The classification benchmark: methods × metrics on one data set (docs/method.md §11).

:func:`run_benchmark` trains one MAP classifier per seed and evaluates each
requested method on the test set, the OOD set and the rotated test sets:

=======================  ==========================================================
``map``                  the trained network's softmax
``map-temp``             the same logits divided by a temperature ``T`` tuned on the
                         validation split (temperature scaling)
``lla-sampled``          linearised Laplace, prior by MacKay/EM with STO samples
                         (:func:`ctuq.classify.laplace.fit_prior`), predictive by
                         Monte Carlo over ``predictive_samples`` linearised-logit samples
``lla-sampled-val``      the same samples, the function-space spread ``J z`` scaled by
                         ``t`` tuned on the validation split
                         (:func:`ctuq.classify.predictive.tune_predictive_scale`): logits
                         ``f + t·J z``, i.e. the posterior covariance ``t² H⁻¹``
``lla-sampled-probit``   the same samples, probit predictive (sample variances)
``lla-last-layer``       as ``lla-sampled`` with only the output layer linearised
                         (:func:`ctuq.classify.laplace.last_layer_filter`; one prior block)
``lla-last-layer-val``   the last-layer LLA with ``t`` tuned on the validation split
``lla-exact``            dense float64 full-GGN Laplace, prior by L-BFGS on the exact
                         Laplace evidence, MC predictive over the exact Gaussian
                         (1000 draws per input)
``lla-exact-val``        the exact LLA's draws with ``t`` tuned on the validation split
``lla-exact-probit``     the same, probit predictive (exact variances)
``lla-exact-prior-val``  the exact LLA with every prior precision multiplied by ``c``
                         tuned on the validation split (the Laplace tutorials' "prior
                         variance tuned on a validation set";
                         :func:`ctuq.classify.predictive.tune_prior_scale`): posterior
                         ``(G + c Σ⁻¹)⁻¹``, MC predictive
``mc-dropout``           a second network with dropout, ``mc_dropout_samples`` passes
``laplace-torch``        laplace-torch's Laplace over all weights, full GGN, layer-wise
                         prior precisions by its marginal likelihood, probit predictive
                         (an independent implementation of ``lla-exact``; only if
                         laplace-torch imports)
``laplace-torch-ll``     laplace-torch's default recipe: last layer, Kronecker-factored
                         GGN, scalar prior precision by marginal likelihood, probit
``laplace-torch-kron``   laplace-torch over all weights with a Kronecker-factored GGN,
                         layer-wise prior by marginal likelihood, probit: the
                         all-weights Laplace where the full GGN is too large
``ivon``                 a second network trained by IVON (:mod:`ctuq.classify.ivon`:
                         variational, diagonal Gaussian posterior, the MAP's prior
                         precision), Monte-Carlo predictive over ``ivon_samples`` weight
                         draws (default 64)
``ivon+lla``             the sampled LLA (as ``lla-sampled``) around the IVON mean
                         ``m`` instead of the MAP ``θ̂``
``ivon+lla-val``         the same with ``t`` tuned on the validation split
=======================  ==========================================================

Validation split: with ``val_fraction > 0`` (default 0.1) a seeded, stratified
part of the *training* set is held out before MAP training
(:func:`validation_split`) for every method, so that all methods share one
network; only the ``-val`` methods (``VAL_METHODS``) and ``map-temp`` look at
it. The test set is never used for tuning.

The ``ivon`` methods train their own network (same architecture and
initialisation seed as the MAP); their ``seconds`` include that training
(as ``mc-dropout``'s), and ``ivon+lla``'s is the IVON training plus its LLA.

Metrics (:mod:`ctuq.classify.metrics`): accuracy, NLL, ECE
(``ece_bins`` equal-width bins, default 15), Brier, OOD AUROC from max-softmax
confidence, accuracy and NLL per rotation angle. Wall times: ``seconds`` per
method excludes the shared MAP training (reported as ``train_seconds``);
the variants of one LLA share one EM fit and one set of samples (their
``seconds`` is that fit plus their own tuning and predictive).

:func:`aggregate` (:mod:`ctuq.classify.report`, re-exported here) turns several seeds
into mean ± std.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from ctuq.data.classification import DEFAULT_ANGLES, ClassificationData, load_classification
from ctuq.errors import InputError
from ctuq.models.classifiers import build_classifier
from ctuq import classify as C
from ctuq.classify import metrics as M
from ctuq.classify.ivon import DEFAULT_PREDICTIVE_SAMPLES, train_ivon
from ctuq.classify.ivon import DEFAULTS as IVON_DEFAULTS
from ctuq.classify.ivon import settings_for as ivon_settings_for
from ctuq.classify.report import (BenchResult, MethodResult, aggregate, benchmark_document,
                                  environment, pooled_reliability, rotation_rows)
from ctuq.posterior.samples import max_residual
from ctuq.progress import check_cancel, emit_progress

__all__ = ["BenchConfig", "MethodResult", "BenchResult", "run_benchmark", "aggregate",
           "METHODS", "DEFAULT_METHODS", "parse_methods", "run_seeds", "pooled_reliability",
           "rotation_rows", "benchmark_document", "environment", "validation_split",
           "VAL_METHODS", "LAPLACE_TORCH_METHODS"]

log = logging.getLogger(__name__)

METHODS = ("map", "map-temp", "lla-sampled", "lla-sampled-val", "lla-sampled-probit",
           "lla-last-layer", "lla-last-layer-val", "lla-exact", "lla-exact-val",
           "lla-exact-probit", "lla-exact-prior-val", "mc-dropout", "laplace-torch",
           "laplace-torch-ll", "laplace-torch-kron", "ivon", "ivon+lla", "ivon+lla-val")
#: Methods that need the optional laplace-torch: (subset of weights, GGN structure).
LAPLACE_TORCH_METHODS = {"laplace-torch": ("all", "full"),
                         "laplace-torch-ll": ("last_layer", "kron"),
                         "laplace-torch-kron": ("all", "kron")}
DEFAULT_METHODS = ("map", "lla-sampled", "lla-sampled-val", "lla-exact", "mc-dropout")
#: Methods that tune something on the validation split.
VAL_METHODS = ("map-temp", "lla-sampled-val", "lla-last-layer-val", "lla-exact-val",
               "lla-exact-prior-val", "ivon+lla-val")


def validation_split(y, fraction: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded, stratified split of training indices into (train, validation).

    Parameters
    ----------
    y : Tensor or ndarray, shape (N,)
        Training labels.
    fraction : float
        Share held out for validation, in ``[0, 1)``; per class
        ``round(fraction · N_c)`` images (at least one of every class with two
        or more images when ``fraction > 0``).
    seed : int, optional

    Returns
    -------
    (Tensor, Tensor)
        Sorted ``int64`` index tensors; disjoint, together ``0 … N−1``.
    """
    fraction = float(fraction)
    if not 0.0 <= fraction < 1.0:
        raise InputError(f"must be in [0, 1), got {fraction!r}", field="val_fraction")
    y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)
    rng = np.random.default_rng(int(seed) + 7919)
    val = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        m = int(round(fraction * idx.size))
        if fraction > 0 and idx.size > 1:
            m = min(max(m, 1), idx.size - 1)
        val.extend(rng.permutation(idx)[:m].tolist())
    val_set = set(val)
    train = [i for i in range(y.size) if i not in val_set]
    return torch.as_tensor(train, dtype=torch.long), torch.as_tensor(sorted(val), dtype=torch.long)


def parse_methods(methods) -> tuple[str, ...]:
    """``'map,lla-sampled'`` or a sequence → validated tuple (``'all'``: every method)."""
    if isinstance(methods, str):
        methods = [m.strip() for m in methods.split(",") if m.strip()]
    methods = tuple(methods)
    if methods == ("all",):
        return METHODS
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise InputError(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}",
                         field="methods")
    return methods


@dataclass(frozen=True)
class BenchConfig:
    """Settings of :func:`run_benchmark` (defaults: the digits benchmark of docs/classification.md).

    Parameters
    ----------
    model : {'mlp', 'cnn'}
        Default ``'mlp'``.
    hidden : tuple of int
        MLP widths. Default ``(32,)`` (2,410 parameters on digits).
    channels : tuple of int
        CNN channels. Default ``(8, 16)``.
    epochs, lr, batch_size : int, float, int
        MAP training (Adam, cosine decay). Defaults 150, 3e-3, 64.
    train_prior_precision : float
        Prior precision (weight decay × N) used for MAP training. Default 1.
    prior : {'ard', 'gprior'}
        Prior of the Laplace methods: layer-wise ARD or the g-prior. Default ``'ard'``.
    em_steps, em_samples : int
        EM steps and samples per E-step. Defaults 10 and 8 (reference).
    em_update : {'mackay', 'em'}
        Default ``'mackay'``.
    lla_mode : {'map', 'linear'}
        Mode of the sampled LLA: the network's ``θ̂`` (post-hoc Laplace) or the
        linearised model's own mode ``θ*`` re-found at every EM step (predictive
        mean ``f(θ̂) + J(θ* − θ̂)``). Default ``'map'``.
    sto : STOOptions
        Sampler settings. Default :data:`ctuq.classify.laplace.CLASSIFIER_STO`.
    predictive_samples : int
        Posterior samples for the sampled predictive. Default 64.
    exact_mc_samples : int
        Draws per input of the exact LLA's MC predictive. Default 1000.
    max_exact_params : int
        ``lla-exact`` is skipped above this ``d_θ``. Default 6000.
    dropout, mc_dropout_samples : float, int
        MC-dropout baseline. Defaults 0.1 and 100.
    ece_bins : int
        Default 15.
    angles : tuple of float
        Rotation angles in degrees. Default 0, 30, …, 180.
    val_fraction : float
        Share of the training set held out (seeded, stratified) for the ``-val``
        methods and ``map-temp``, before MAP training, for all methods. 0: no
        split (those methods are then an error). Default 0.1.
    ivon_lr, ivon_hess_init : float or None
        IVON training (:func:`ctuq.classify.ivon.train_ivon`; ``epochs``,
        ``batch_size`` and ``train_prior_precision`` as MAP's). Default None:
        the data set's validated setting
        (:func:`ctuq.classify.ivon.settings_for`: 2 and 10 on digits, 0.03 and
        0.03 on Fashion-MNIST; docs/ivon.md).
    ivon_beta2 : float
        Default 0.999.
    ivon_prior_precision : float or None
        ``α`` of IVON's Gaussian weight prior; None: ``train_prior_precision``
        (MAP's). Default None.
    ivon_samples : int
        Weight samples of the IVON Monte-Carlo predictive. Default 64.
    ivon_temperature : float or None
        ``T`` of IVON's tempered likelihood (``ess = N/T``; the prior untempered).
        Default None: the data set's validated setting (1, the Bayesian
        posterior, on digits; 0.1 on Fashion-MNIST, chosen on its validation
        tenth, docs/ivon.md §7.3).
    """

    model: str = "mlp"
    hidden: tuple = (32,)
    channels: tuple = (8, 16)
    epochs: int = 150
    lr: float = 3e-3
    batch_size: int = 64
    train_prior_precision: float = 1.0
    prior: str = "ard"
    em_steps: int = 10
    em_samples: int = 8
    em_update: str = "mackay"
    lla_mode: str = "map"
    sto: C.STOOptions = C.CLASSIFIER_STO
    predictive_samples: int = 64
    exact_mc_samples: int = 1000
    max_exact_params: int = 6000
    dropout: float = 0.1
    mc_dropout_samples: int = 100
    ece_bins: int = 15
    angles: tuple = tuple(float(a) for a in DEFAULT_ANGLES)
    val_fraction: float = 0.1
    ivon_lr: float | None = None
    ivon_hess_init: float | None = None
    ivon_beta2: float = IVON_DEFAULTS["beta2"]
    ivon_prior_precision: float | None = None
    ivon_samples: int = DEFAULT_PREDICTIVE_SAMPLES
    ivon_temperature: float | None = None

    def __post_init__(self):
        if not 0.0 <= float(self.val_fraction) < 1.0:
            raise InputError(f"must be in [0, 1), got {self.val_fraction!r}",
                             field="val_fraction")
        if not 0.0 <= float(self.train_prior_precision) < float("inf"):
            raise InputError(f"must be a finite number >= 0, got {self.train_prior_precision!r}",
                             field="train_prior_precision")
        if self.prior not in C.PRIORS:
            raise InputError(f"must be one of {', '.join(C.PRIORS)}, got {self.prior!r}",
                             field="prior")
        if self.lla_mode not in ("map", "linear"):
            raise InputError(f"must be 'map' or 'linear', got {self.lla_mode!r}",
                             field="lla_mode")
        if self.em_update not in ("mackay", "em"):
            raise InputError(f"must be 'mackay' or 'em', got {self.em_update!r}",
                             field="em_update")
        for name in ("em_samples", "predictive_samples", "epochs", "ece_bins",
                     "mc_dropout_samples", "exact_mc_samples", "ivon_samples"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"must be >= 1, got {getattr(self, name)!r}", field=name)
        for name in ("ivon_lr", "ivon_hess_init", "ivon_temperature"):
            if getattr(self, name) is not None and \
                    not 0.0 < float(getattr(self, name)) < float("inf"):
                raise InputError(f"must be a finite number > 0, got {getattr(self, name)!r}",
                                 field=name)
        if self.ivon_prior_precision is not None and \
                not 0.0 < float(self.ivon_prior_precision) < float("inf"):
            raise InputError(f"must be a finite number > 0, got {self.ivon_prior_precision!r}",
                             field="ivon_prior_precision")
        if not 0.0 <= float(self.ivon_beta2) < 1.0:
            raise InputError(f"must be in [0, 1), got {self.ivon_beta2!r}", field="ivon_beta2")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sto"] = asdict(self.sto)
        return d

    def with_(self, **changes) -> "BenchConfig":
        return replace(self, **changes)


def _evaluate(predict, data: ClassificationData, cfg: BenchConfig) -> MethodResult:
    """Run ``predict(x) -> probs`` on the test, OOD and rotated sets and score it."""
    p_test = predict(data.x_test)
    metrics = M.classification_metrics(p_test, data.y_test, cfg.ece_bins)
    metrics["ood_auroc"] = M.ood_auroc(p_test, predict(data.x_ood))
    rotation = []
    for ang in cfg.angles:
        p = p_test if float(ang) % 360 == 0 else predict(data.rotated(ang))
        rotation.append({"angle": float(ang), "accuracy": M.accuracy(p, data.y_test),
                         "nll": M.nll(p, data.y_test)})
    shifted = [r for r in rotation if r["angle"] % 360 != 0]
    metrics["rotation_nll"] = float(np.mean([r["nll"] for r in shifted])) if shifted else \
        float("nan")
    metrics["rotation_accuracy"] = float(np.mean([r["accuracy"] for r in shifted])) \
        if shifted else float("nan")
    return MethodResult(metrics, rotation, M.reliability(p_test, data.y_test, cfg.ece_bins),
                        0.0, test_probs=np.asarray(p_test.detach().cpu().double()))


def _cached(fn):
    """Memoise ``fn(x)`` by tensor identity (the same eval sets are asked for twice)."""
    store: dict = {}

    def wrapped(x):
        key = id(x)
        if key not in store:
            store[key] = (x, fn(x))
        return store[key][1]
    return wrapped


def run_benchmark(data: ClassificationData | str = "digits", methods=DEFAULT_METHODS,
                  config: BenchConfig | None = None, *, seed: int = 0, data_dir=None,
                  progress=None, cancel=None) -> BenchResult:
    """Run the benchmark on one seed.

    Parameters
    ----------
    data : ClassificationData or str, optional
        A loaded data set, or its name (loaded with ``seed`` and ``data_dir``).
        Default ``'digits'``.
    methods : str or sequence of str, optional
        Any of :data:`METHODS`. Default ``map, lla-sampled, lla-exact, mc-dropout``.
    config : BenchConfig, optional
    seed : int, optional
        Seeds the split (when loading), the network initialisation, the
        mini-batches and every sample. Default 0.
    data_dir : str or Path, optional
    progress, cancel : callable, optional
        Stages ``'train'``, ``'em'``, ``'sampling'``, ``'exact'``, ``'evaluate'``.

    Returns
    -------
    BenchResult
    """
    cfg = config or BenchConfig()
    methods = parse_methods(methods)
    if isinstance(data, str):
        data = load_classification(data, data_dir, seed=seed)
    x_val = y_val = None
    if cfg.val_fraction > 0:
        tr_idx, va_idx = validation_split(data.y_train, cfg.val_fraction, seed)
        x_val, y_val = data.x_train[va_idx], data.y_train[va_idx]
        data = replace(data, x_train=data.x_train[tr_idx], y_train=data.y_train[tr_idx],
                       info={**data.info, "n_val": int(va_idx.numel()),
                             "val_fraction": float(cfg.val_fraction)})
    elif any(m in VAL_METHODS for m in methods):
        raise InputError(f"{', '.join(m for m in methods if m in VAL_METHODS)} need a "
                         "validation split (val_fraction > 0)", field="val_fraction")
    ivon_alpha = cfg.train_prior_precision if cfg.ivon_prior_precision is None \
        else cfg.ivon_prior_precision
    if any(m.startswith("ivon") for m in methods) and not ivon_alpha > 0:
        raise InputError("the ivon methods need a prior precision > 0 (set "
                         "ivon_prior_precision)", field="train_prior_precision")
    n_train = int(data.x_train.shape[0])
    if cfg.sto.batch_size is not None and cfg.sto.batch_size > n_train:
        # before training, not after it
        raise InputError(f"must be at most the {n_train} training images (after the "
                         f"validation split), got {cfg.sto.batch_size}", field="sto_batch_size")
    gen = torch.Generator().manual_seed(int(seed) + 1)
    kw = {"hidden": tuple(cfg.hidden), "channels": tuple(cfg.channels)}
    net = build_classifier(cfg.model, data.image_shape, data.num_classes, seed=seed, **kw)
    tr = C.train_map(net, data.x_train, data.y_train, epochs=cfg.epochs, lr=cfg.lr,
                     batch_size=cfg.batch_size, prior_precision=cfg.train_prior_precision,
                     seed=seed, progress=progress, cancel=cancel)
    clin = C.ClassifierLinearization(net, data.x_train)
    out: dict[str, MethodResult] = {}
    skipped: dict[str, str] = {}
    done = [0]

    def step(name):
        done[0] += 1
        emit_progress(progress, "evaluate", done[0], len(methods), name)

    def timed(name, fn, setup_seconds=0.0, extra=None):
        check_cancel(cancel, "benchmark")
        t0 = time.perf_counter()
        res = _evaluate(_cached(fn), data, cfg)
        res.seconds = setup_seconds + time.perf_counter() - t0
        res.extra = extra or {}
        out[name] = res
        step(name)

    def tuned(mean, dev, setup, extra):
        """Tune ``t`` on the validation split; (predict, seconds, extra) of the scaled LLA."""
        t0 = time.perf_counter()
        tune = C.tune_predictive_scale(mean(x_val), dev(x_val), y_val)
        t = tune["scale"]
        if tune["at_boundary"]:
            log.warning("the tuned predictive scale %.3g is at the grid's end", t)
        ex = dict(extra, scale=t, val_nll=tune["nll"], val_nll_at_1=tune["nll_at_1"],
                  n_val=int(y_val.numel()), scale_at_boundary=tune["at_boundary"])
        return (lambda x: C.scaled_mc_predictive(mean(x), dev(x), t),
                setup + time.perf_counter() - t0, ex)

    if "map" in methods:
        timed("map", lambda x: clin.probs(x).double())
    if "map-temp" in methods:
        t0 = time.perf_counter()
        temp = C.tune_temperature(clin.logits(x_val), y_val)
        timed("map-temp", lambda x: torch.softmax(clin.logits(x).double() / temp["temperature"],
                                                  -1),
              time.perf_counter() - t0, dict(temp, n_val=int(y_val.numel())))

    ivon_clf = None
    if any(m.startswith("ivon") for m in methods):
        ivon_clf = train_ivon(
            build_classifier(cfg.model, data.image_shape, data.num_classes, seed=seed, **kw),
            data.x_train, data.y_train, epochs=cfg.epochs, batch_size=cfg.batch_size,
            beta2=cfg.ivon_beta2, prior_precision=ivon_alpha, seed=seed, progress=progress,
            cancel=cancel, **ivon_settings_for(data.name, lr=cfg.ivon_lr,
                                               hess_init=cfg.ivon_hess_init,
                                               temperature=cfg.ivon_temperature))
        var = ivon_clf.posterior.variance
        ivon_extra = {"settings": ivon_clf.settings.to_dict(), "train_seconds": ivon_clf.seconds,
                      "final_loss": ivon_clf.loss[-1], "variance_median": float(var.median()),
                      "variance_mean": float(var.mean()),
                      "note": "includes training its own network"}
    if "ivon" in methods:
        timed("ivon", lambda x: ivon_clf.predict(x, cfg.ivon_samples, seed=seed),
              ivon_clf.seconds, dict(ivon_extra, samples=cfg.ivon_samples))

    # (family, its linearisation, seconds already spent on its network, extra info)
    families = [("lla-sampled", lambda: clin, 0.0, {}),
                ("lla-last-layer", lambda: C.ClassifierLinearization(
                    net, data.x_train, param_filter=C.last_layer_filter(net)), 0.0, {})]
    if ivon_clf is not None:
        families.append(("ivon+lla", lambda: C.ClassifierLinearization(ivon_clf.model,
                                                                       data.x_train),
                         ivon_clf.seconds, {"ivon": ivon_extra}))
    for fam, make_lin, spent, fam_extra in families:
        wanted = [m for m in methods if m == fam or m.startswith(fam + "-")]
        if not wanted:
            continue
        t0 = time.perf_counter() - spent
        lin = make_lin()
        probs_train = lin.probs(data.x_train)
        prior = C.build_prior(lin, data.x_train, cfg.prior, probs=probs_train,
                              generator=gen) if cfg.prior == "gprior" else \
            C.build_prior(lin, data.x_train, cfg.prior)
        em = C.fit_prior(lin, data.x_train, prior, em_steps=cfg.em_steps, k=cfg.em_samples,
                         update=cfg.em_update, probs=probs_train, options=cfg.sto,
                         generator=gen, mode=cfg.lla_mode, y=data.y_train,
                         progress=progress, cancel=cancel)
        probs_train = em.likelihood.probs  # the GGN's p_n (at θ* with lla_mode='linear')
        sample = C.sample_sto(lin, data.x_train, prior, cfg.predictive_samples,
                              probs=probs_train, options=cfg.sto, generator=gen,
                              progress=progress, cancel=cancel)
        shift = em.theta_star - lin.theta_hat  # exactly 0 for the post-hoc Laplace ('map')
        setup = time.perf_counter() - t0
        extra = {**fam_extra, "variances": em.hyperparameters()["a_b"],
                 "blocks": list(prior.block_names),
                 "num_params": lin.num_params, "mode": cfg.lla_mode,
                 "em_trace": em.trace, "em_seconds": em.info["seconds"],
                 "sto_iterations": sample.info["iterations"],
                 "sto_seconds": sample.info["time"],
                 "sto_max_residual": max_residual(sample.info)}
        fs = _cached(lambda x, lin=lin, z=sample.z + shift: C.function_samples(lin, z, x))
        mean_logits = _cached(lambda x, lin=lin, sh=shift.reshape(1, -1):
                              C.function_samples(lin, sh, x)[0])
        # in float64 (float32 differences are exact there): t = 1 is the plain LLA bit for bit
        dev = _cached(lambda x, fs=fs, mean_logits=mean_logits:
                      fs(x).double() - mean_logits(x).double())
        if fam in methods:
            timed(fam, lambda x, fs=fs: C.mc_predictive(fs(x)), setup, extra)
        if fam + "-val" in methods:
            timed(fam + "-val", *tuned(mean_logits, dev, setup, extra))
        if fam + "-probit" in methods:
            def probit(x, fs=fs, mean_logits=mean_logits):
                f = mean_logits(x)
                return C.probit_predictive(f, C.sample_function_variance(fs(x) - f))
            timed(fam + "-probit", probit, setup, extra)

    exact = [m for m in methods if m.startswith("lla-exact")]
    if exact and clin.num_params > cfg.max_exact_params:
        for m in exact:
            skipped[m] = (f"{clin.num_params} parameters > max_exact_params "
                          f"{cfg.max_exact_params}")
        exact = []
    if exact:
        t0 = time.perf_counter()
        lla = C.ExactLLA(clin, data.x_train, data.y_train, progress=progress, cancel=cancel)
        prior_x = C.build_prior(clin, data.x_train, cfg.prior, generator=gen) \
            if cfg.prior == "gprior" else C.build_prior(clin, data.x_train, cfg.prior)
        opt = lla.optimize_prior(prior_x)
        setup = time.perf_counter() - t0
        extra = {"variances": opt["variances"], "gamma": opt["gamma"],
                 "log_evidence": opt["log_evidence"], "ggn_seconds": lla.seconds_ggn,
                 "evidence_seconds": opt["seconds"]}
        fc = _cached(lambda x: lla.function_covariance(prior_x, x))
        if "lla-exact" in methods:
            timed("lla-exact", lambda x: C.gaussian_mc_predictive(
                *fc(x), cfg.exact_mc_samples, gen), setup, extra)
        if "lla-exact-val" in methods:
            draws = _cached(lambda x: C.gaussian_deviations(fc(x)[1], cfg.exact_mc_samples,
                                                            gen))
            timed("lla-exact-val", *tuned(lambda x: fc(x)[0], draws, setup, extra))
        if "lla-exact-probit" in methods:
            timed("lla-exact-probit", lambda x: C.probit_predictive(
                fc(x)[0], fc(x)[1].diagonal(dim1=-2, dim2=-1)), setup, extra)
        if "lla-exact-prior-val" in methods:
            t1 = time.perf_counter()
            W, lam = lla.prior_scale_basis(prior_x)
            tune = C.tune_prior_scale(*lla.prior_scale_factor(W, x_val), lam, y_val,
                                      n_samples=cfg.exact_mc_samples, generator=gen)
            c = tune["scale"]

            def prior_val(x, W=W, lam=lam, c=c):
                f, K = lla.prior_scale_factor(W, x)
                return C.gaussian_mc_predictive(f, C.scaled_prior_covariance(K, lam, c),
                                                cfg.exact_mc_samples, gen)
            timed("lla-exact-prior-val", prior_val, setup + time.perf_counter() - t1,
                  dict(extra, prior_scale=c, val_nll=tune["nll"], val_nll_at_1=tune["nll_at_1"],
                       n_val=int(y_val.numel()), prior_scale_at_boundary=tune["at_boundary"]))

    if "mc-dropout" in methods:
        t0 = time.perf_counter()
        dnet = build_classifier(cfg.model, data.image_shape, data.num_classes, seed=seed,
                                dropout=cfg.dropout, **kw)
        C.train_map(dnet, data.x_train, data.y_train, epochs=cfg.epochs, lr=cfg.lr,
                    batch_size=cfg.batch_size, prior_precision=cfg.train_prior_precision,
                    seed=seed, cancel=cancel)
        timed("mc-dropout", lambda x: C.mc_dropout_predict(dnet, x, cfg.mc_dropout_samples,
                                                           seed),
              time.perf_counter() - t0, {"dropout": cfg.dropout,
                                         "samples": cfg.mc_dropout_samples,
                                         "note": "includes training its own network"})

    for name, (subset, structure) in LAPLACE_TORCH_METHODS.items():
        if name not in methods:
            continue
        if not C.laplace_torch_available():
            skipped[name] = ("laplace-torch does not import here "
                             "(optional; see docs/classification.md)")
            continue
        if structure == "full" and clin.num_params > cfg.max_exact_params:
            skipped[name] = (f"{clin.num_params} parameters > max_exact_params "
                             f"{cfg.max_exact_params}")
            continue
        t0 = time.perf_counter()
        predict, info = C.laplace_torch_fit(net, data.x_train, data.y_train, subset=subset,
                                            structure=structure)
        timed(name, predict, time.perf_counter() - t0, info)
    for m, why in skipped.items():
        log.warning("skipped %s: %s", m, why)
    return BenchResult(data.summary(), cfg.to_dict(), int(seed), out, skipped,
                       tr["seconds"], clin.num_params, data)


def run_seeds(dataset: str = "digits", methods=DEFAULT_METHODS,
              config: BenchConfig | None = None, seeds=(0,), *, data_dir=None, ood_dir=None,
              n_train: int | None = None, n_test: int | None = None, progress=None,
              cancel=None) -> list:
    """:func:`run_benchmark` for each seed (the data split follows the seed), a list of results."""
    out = []
    for s in seeds:
        data = load_classification(dataset, data_dir, seed=int(s), ood_dir=ood_dir,
                                   n_train=n_train, n_test=n_test)
        out.append(run_benchmark(data, methods, config, seed=int(s), progress=progress,
                                 cancel=cancel))
    return out
