

def test_the_config_file_defaults_are_the_domain_defaults() -> None:
    """One place for each default: the agent's config models read the dataclasses' own defaults."""
    from dataclasses import fields

    from gpufleet.agent.config import CadenceModel, ThresholdsModel
    from gpufleet.agent.rules import Thresholds
    from gpufleet.agent.runner import Cadence

    for model, cls in ((ThresholdsModel, Thresholds), (CadenceModel, Cadence)):
        assert set(model.model_fields) == {f.name for f in fields(cls)}
        assert model().build() == cls()
