import pytest

from ctuq.errors import InputError
from ctuq.recon.config import ReconstructionConfig, UncertaintyConfig


def test_auto_preset_resolves_by_image_size():
    cfg = ReconstructionConfig()
    assert cfg.preset_for((28, 28)) == "reference-28"
    assert cfg.preset_for((128, 128)) == "dip-128"
    dip, unc = cfg.resolve((64, 64))
    assert dip.preset == "dip-64" and dip.seed == 0
    assert isinstance(unc, UncertaintyConfig)


def test_preconditioner_rank_grows_with_the_preset_and_yields_to_overrides():
    cfg = ReconstructionConfig()
    ranks = [cfg.resolve((n, n))[1].preconditioner_rank for n in (28, 64, 128, 256)]
    assert ranks[0] == UncertaintyConfig().preconditioner_rank
    assert min(ranks[1:]) > ranks[0] and ranks[-1] == max(ranks)
    mine = ReconstructionConfig(uncertainty={"preconditioner_rank": 7})
    assert mine.resolve((256, 256))[1].preconditioner_rank == 7


def test_overrides_reach_the_stages_and_seed_propagates():
    cfg = ReconstructionConfig(seed=5, dip={"iterations": 7}, uncertainty={"n_samples": 3})
    dip, unc = cfg.resolve((28, 28))
    assert dip.iterations == 7 and dip.seed == 5 and unc.n_samples == 3


def test_toml_round_trip_and_merge(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "dip-64"\nseed = 3\n[dip]\niterations = 11\n'
                    '[uncertainty]\npredcp = false\n')
    base = ReconstructionConfig(dip={"lr": 1e-3})
    cfg = ReconstructionConfig.from_toml(path, base)
    assert cfg.preset == "dip-64" and cfg.seed == 3
    assert cfg.dip == {"lr": 1e-3, "iterations": 11}
    assert cfg.uncertainty == {"predcp": False}
    assert ReconstructionConfig.from_dict(cfg.to_dict()) == cfg


def test_none_unsets_an_optional_number_in_a_toml_file(tmp_path):
    # TOML has no null: "none" is how a file turns off a setting whose default is a number
    path = tmp_path / "c.toml"
    path.write_text('[uncertainty.laplace]\npreconditioner_max_ratio = "none"\n'
                    'preconditioner_max_rank = 800\n')
    _, unc = ReconstructionConfig.from_toml(path).resolve((64, 64))
    assert unc.laplace.preconditioner_max_ratio is None
    assert unc.laplace.preconditioner_max_rank == 800
    # a setting that must be given stays required, and a misspelling is not "none"
    for bad in ('n_samples = "none"', 'preconditioner_max_ratio = "nine"'):
        path.write_text(f"[uncertainty.laplace]\n{bad}\n")
        with pytest.raises(InputError) as info:
            ReconstructionConfig.from_toml(path).resolve((64, 64))
        assert bad.split(" =")[0] in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("text, field", [
    ('preset = "huge"', "preset"),
    ('colour = 1', "colour"),
    ('[dip]\nwings = 2', "dip.wings"),
    ('[uncertainty]\nsampler = "mcmc"', "uncertainty.sampler"),
    ('[uncertainty]\nn_samples = 0', "uncertainty.n_samples"),
    ('backend = "gpu"', "backend"),
    ('seed = "x"', "seed"),
    ('[dip]\niterations = 0', "dip.iterations"),
    ('this is not toml', "--config"),
])
def test_bad_config_names_file_and_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        cfg = ReconstructionConfig.from_toml(path)
        cfg.resolve((28, 28))
    assert field in str(info.value)
    assert str(path) in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(InputError, match="no such config file"):
        ReconstructionConfig.from_toml(tmp_path / "nope.toml")


def test_method_sub_tables_and_the_flat_laplace_keys_are_one_setting(tmp_path):
    flat = ReconstructionConfig(uncertainty={"n_samples": 3, "predcp": True})
    nested = ReconstructionConfig(uncertainty={"laplace": {"n_samples": 3, "predcp": True}})
    # kept as given (a file written before the sub-tables reads back the same) ...
    assert flat.uncertainty == {"n_samples": 3, "predcp": True}
    assert ReconstructionConfig.from_dict(flat.to_dict()) == flat
    # ... and the same settings wherever it matters: resolution and the resume check
    assert flat.resolve((64, 64)) == nested.resolve((64, 64))
    assert flat.result_affecting() == nested.result_affecting()
    _, unc = nested.resolve((64, 64))
    assert unc.n_samples == unc.laplace.n_samples == 3 and unc.preconditioner_rank == 400
    merged = flat.merged({"uncertainty": {"laplace": {"em_steps": 2}}})
    assert merged.resolve((28, 28))[1].laplace.n_samples == 3
    assert merged.resolve((28, 28))[1].em_steps == 2
    path = tmp_path / "m.toml"
    path.write_text('[uncertainty]\nmethod = "ivon"\npredictive_samples = 4\n'
                    '[uncertainty.ivon]\niterations = 7\ness = 16.0\n'
                    '[uncertainty.mc_dropout]\ndropout = 0.2\n')
    _, unc = ReconstructionConfig.from_toml(path).resolve((28, 28))
    assert (unc.ivon.iterations, unc.ivon.ess, unc.mc_dropout.dropout) == (7, 16.0, 0.2)
    assert unc.method_settings is unc.ivon
    assert set(unc.effective()) >= {"method", "predictive_samples", "model_error", "ivon"}
    assert "laplace" not in unc.effective()


def test_an_unknown_key_in_uncertainty_names_it():
    with pytest.raises(InputError) as err:
        ReconstructionConfig(uncertainty={"wings": 2})
    assert err.value.field == "uncertainty.wings"
    with pytest.raises(InputError) as err:
        ReconstructionConfig(uncertainty={"ivon": {"wings": 2}})
    assert err.value.field == "uncertainty.ivon.wings"


def test_runtime_only_settings_do_not_make_a_resumed_result_stale():
    # the device, the thread count and the CUDA graph change how a run computes, not what
    base = ReconstructionConfig(dip={"iterations": 7})
    runtime = ReconstructionConfig(dip={"iterations": 7, "cuda_graph": False}, device="cpu",
                                   threads=1)
    assert runtime.result_affecting() == base.result_affecting()
    other = ReconstructionConfig(dip={"iterations": 8, "cuda_graph": False})
    assert other.result_affecting() != base.result_affecting()
