"""controller.toml and agent.toml: the environment overrides the file (docs/configuration.md), and a bad
key or value is named with what was expected, a secret never echoed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.config import load_config
from gpufleet.controller.settings import load_settings
from gpufleet.domain.errors import InvalidInput

TOKEN = "0123456789abcdef-secret"


def _toml(tmp_path: Path, text: str, name: str = "controller.toml") -> Path:
    path = tmp_path / name
    path.write_text(text + "\n", encoding="utf-8")
    return path


def test_the_environment_overrides_the_controller_file_and_options_override_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _toml(tmp_path, 'scheduler = "sim"\nport = 9000\n[retention]\nevents = "30d"')
    assert load_settings(f).port == 9000
    monkeypatch.setenv("GPUFLEET_PORT", "9100")
    monkeypatch.setenv("gpufleet_retention", '{"events": "90d"}')  # names are case-insensitive
    s = load_settings(f)
    assert (s.port, s.retention.events.days) == (9100, 90)
    assert load_settings(f, port=9200).port == 9200


def test_the_environment_overrides_the_agent_file_and_options_override_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _toml(tmp_path, 'gpus = 4\ndevice = "sim"', "agent.toml")
    monkeypatch.setenv("GPUFLEET_AGENT_GPUS", "2")
    assert load_config(f).gpus == 2
    assert load_config(f, gpus=6).gpus == 6


@pytest.mark.parametrize(("text", "field", "hint"), [
    ('schedular = "sim"', "schedular", "the top level has no 'schedular' (did you mean 'scheduler'?)"),
    ('scheduler = "sim"\n[repair]\nagnet = true', "repair.agnet", "[repair] has no 'agnet' (did you mean 'agent'?)"),
    (f'scheduler = "sim"\n[[tokens]]\nname = "a"\nrol = "viewer"\ntoken = "{TOKEN}"', "tokens.0.rol",
     "[[tokens]] has no 'rol' (did you mean 'role'?)"),
    ('scheduler = "sim"\nzzz = 1', "zzz", "see docs/configuration.md"),
])
def test_a_misspelt_controller_key_is_named_with_the_nearest_known_one(tmp_path: Path, text: str, field: str,
                                                                       hint: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(_toml(tmp_path, text))
    assert err.value.field == field
    assert hint in err.value.expected and "Extra inputs" not in str(err.value)


def test_a_misspelt_agent_key_is_named_with_the_nearest_known_one(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        load_config(_toml(tmp_path, "[cadence]\nslow = 10", "agent.toml"))
    assert err.value.field == "cadence.slow" and "did you mean 'slow_s'?" in err.value.expected


def test_a_bad_value_says_what_was_expected_without_pydantic_prefixes(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(_toml(tmp_path, 'scheduler = "sim"\n[retention]\nevents = "90x"'))
    assert (err.value.field, err.value.value) == ("retention.events", "90x")
    assert err.value.expected.startswith("a duration such as")


@pytest.mark.parametrize("text", [
    f'[[tokens]]\nname = "a"\nrole = "agent"\ntoken = "{TOKEN}"',  # the whole entry is refused (no nodes)
    '[[tokens]]\nname = "a"\nrole = "viewer"\ntoken = "short-secret"',  # the token itself is refused
])
def test_a_refused_token_entry_does_not_echo_the_secret(tmp_path: Path, text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(_toml(tmp_path, 'scheduler = "sim"\n' + text))
    assert err.value.field.startswith("tokens.0")
    assert TOKEN not in str(err.value) and "short-secret" not in str(err.value) and "<hidden>" in str(err.value)


@pytest.mark.parametrize("zero", ['0', '"0"', '"0s"', '"0ms"', '"0d"'])
def test_a_zero_retention_is_accepted_however_it_is_written(tmp_path: Path, zero: str) -> None:
    s = load_settings(_toml(tmp_path, f'scheduler = "sim"\n[retention]\nevents = {zero}\nbundles = {zero}'))
    assert not s.retention.events and not s.retention.bundles


@pytest.mark.parametrize("bad", ['"-1d"', '"soon"', "true"])
def test_a_retention_that_is_neither_zero_nor_a_duration_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(_toml(tmp_path, f'scheduler = "sim"\n[retention]\nevents = {bad}'))
    assert err.value.field == "retention.events"


@pytest.mark.parametrize(("written", "seconds"), [('"90s"', 90.0), ('"1m30s"', 90.0), ('"2h"', 7200.0), ("1.5", 1.5),
                                                  ("2", 2.0), ('"45"', 45.0)])
def test_a_seconds_setting_takes_a_number_or_a_duration(tmp_path: Path, written: str, seconds: float) -> None:
    f = _toml(tmp_path, f'scheduler = "sim"\nreconcile_interval = {written}\n[retention]\ninterval = {written}\n'
                        f'[limits]\nkeep_alive_s = {written}')
    s = load_settings(f)
    assert (s.reconcile_interval, s.retention.interval, s.limits.keep_alive_s) == (seconds, seconds, seconds)


@pytest.mark.parametrize("written", ['"soon"', "true", '"-5s"', "[1]"])
def test_a_seconds_setting_names_itself_when_neither(tmp_path: Path, written: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_settings(_toml(tmp_path, f'scheduler = "sim"\nreconcile_interval = {written}'))
    assert err.value.field == "reconcile_interval" and "seconds" in err.value.expected


def test_an_agent_seconds_setting_takes_a_duration_from_the_file_and_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _toml(tmp_path, 'device = "sim"\nheartbeat_s = "1m"\nreboot_wait_s = "15m"', "agent.toml")
    c = load_config(f)
    assert (c.heartbeat_s, c.reboot_wait_s) == (60.0, 900.0)
    with pytest.raises(InvalidInput) as err:
        load_config(_toml(tmp_path, 'device = "sim"\nheartbeat_s = "often"', "bad.toml"))
    assert err.value.field == "heartbeat_s" and "seconds" in err.value.expected
    monkeypatch.setenv("GPUFLEET_AGENT_HEARTBEAT_S", "45s")
    assert load_config(f).heartbeat_s == 45.0
