from pathlib import Path

import pytest


def test_the_config_file_defaults_are_the_domain_defaults() -> None:
    """One place for each default: the agent's config models read the dataclasses' own defaults."""
    from dataclasses import fields

    from gpufleet.agent.config import CadenceModel, ThresholdsModel
    from gpufleet.agent.rules import Thresholds
    from gpufleet.agent.runner import Cadence

    for model, cls in ((ThresholdsModel, Thresholds), (CadenceModel, Cadence)):
        assert set(model.model_fields) == {f.name for f in fields(cls)}
        assert model().build() == cls()


def test_thresholds_that_cannot_work_are_refused_naming_the_key(tmp_path: Path) -> None:
    """A re-arm point above the limit would report a GPU between the two every second; a negative
    expected InfiniBand rate would judge nothing."""
    from gpufleet.agent.config import load_config
    from gpufleet.domain.errors import InvalidInput

    cfg = tmp_path / "agent.toml"
    for toml, field in (
        ("[thresholds]\nthermal_c = 80\nthermal_clear_c = 90\n", "thresholds.thermal_clear_c"),
        ("[thresholds]\nthermal_clear_c = 88\n", "thresholds.thermal_clear_c"),  # above the default 87
        ("[thresholds]\nib_expected_rate_gbps = -400\n", "thresholds.ib_expected_rate_gbps"),
        ("[thresholds]\nthermal_c = -5\nthermal_clear_c = -10\n", "thresholds.thermal_c"),  # every GPU would fire
        ("[thresholds]\nhbm_thermal_c = 12\n", "thresholds.hbm_thermal_c"),
        ("[thresholds]\nweak_link_interval_s = 0\n", "thresholds.weak_link_interval_s"),  # a report per read
        ("[thresholds]\nweak_link_events = \"no\"\n", "thresholds.weak_link_events"),  # a string is not a switch
    ):
        cfg.write_text(toml)
        with pytest.raises(InvalidInput) as err:
            load_config(cfg)
        assert err.value.field == field, toml
    cfg.write_text("[thresholds]\nthermal_c = 90\nthermal_clear_c = 85\nib_expected_rate_gbps = 400\n"
                   "weak_link_events = false\nweak_link_interval_s = \"5m\"\n")
    built = load_config(cfg).thresholds.build()
    assert (built.thermal_clear_c, built.weak_link_events, built.weak_link_interval_s) == (85, False, 300)
