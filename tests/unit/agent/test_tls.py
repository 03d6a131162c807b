"""agent/tls.client_tls: the agent's TLS settings are checked at start, each error naming its setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpufleet.agent.config import load_config
from gpufleet.agent.tls import client_tls
from gpufleet.domain.errors import InvalidInput

HTTPS = "https://ctl.example:8443"


def test_without_settings_the_system_trust_store_is_used() -> None:
    assert client_tls(HTTPS) is True


@pytest.mark.parametrize(("cert", "key", "missing"), [("a.crt", None, "client_key"), (None, "a.key", "client_cert")])
def test_half_a_client_certificate_names_the_missing_half(cert: str | None, key: str | None, missing: str) -> None:
    with pytest.raises(InvalidInput) as err:
        client_tls(HTTPS, None, None if cert is None else Path(cert), None if key is None else Path(key))
    assert err.value.field == missing
    assert "needs both" in str(err.value)


def test_tls_files_with_a_plain_http_controller_are_refused() -> None:
    with pytest.raises(InvalidInput) as err:
        client_tls("http://ctl.example:8080", Path("/etc/ca.crt"))
    assert err.value.field == "ca_file"
    assert "https://" in str(err.value)


def test_an_unreadable_ca_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput) as err:
        client_tls(HTTPS, tmp_path / "missing.crt")
    assert err.value.field == "ca_file"
    assert str(tmp_path / "missing.crt") in str(err.value)


def test_a_ca_file_that_is_not_pem_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "ca.crt"
    bad.write_text("not a certificate\n", encoding="utf-8")
    with pytest.raises(InvalidInput) as err:
        client_tls(HTTPS, bad)
    assert err.value.field == "ca_file"


def test_a_client_key_that_is_not_pem_is_named(tmp_path: Path) -> None:
    cert, key = tmp_path / "a.crt", tmp_path / "a.key"
    cert.write_text("x\n", encoding="utf-8")
    key.write_text("y\n", encoding="utf-8")
    with pytest.raises(InvalidInput) as err:
        client_tls(HTTPS, None, cert, key)
    assert err.value.field == "client_cert"
    assert str(key) in str(err.value)


def test_a_plain_http_controller_off_this_host_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.tls"):
        assert client_tls("http://ctl.example:8080") is True
        assert client_tls("http://127.0.0.1:8080") is True
        assert client_tls("ctl:8470") is True  # not a URL at all: the agent's push refuses it, no warning first
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "ctl.example" in warned[0] and "in clear" in warned[0]


def test_the_settings_are_part_of_the_agent_config(tmp_path: Path) -> None:
    cfg = load_config(None, controller=HTTPS, ca_file=tmp_path / "ca.crt", client_cert=tmp_path / "n.crt",
                      client_key=tmp_path / "n.key")
    assert (cfg.ca_file, cfg.client_cert, cfg.client_key) == (tmp_path / "ca.crt", tmp_path / "n.crt",
                                                            tmp_path / "n.key")
