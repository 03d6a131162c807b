"""Files the controller's config names are checked when it starts, each error naming its setting:
``[tls]`` (uvicorn used to fail with a traceback after "controller on https://..."), ``topology_file`` and
``policy_file`` (read after the database was migrated; a missing topology was a "not found" naming no
setting) and ``[repair] ticket_token_file``."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.controller.runtime import build, check_server_tls
from gpufleet.controller.settings import ControllerSettings, RepairSettings, SchedulerKind, TlsSettings
from gpufleet.domain.errors import InvalidInput
from gpufleet.schedulers.sim import SimScheduler


def _settings(tmp_path: Path, **kw: object) -> ControllerSettings:
    return ControllerSettings(database_url=f"sqlite:///{tmp_path / 'c.db'}", port=0, scheduler=SchedulerKind.SIM,
                              **kw)  # type: ignore[arg-type]


def test_good_tls_files_pass(tmp_path: Path, certs: Path) -> None:
    check_server_tls(_settings(tmp_path, tls=TlsSettings(certfile=certs / "server.crt", keyfile=certs / "server.key",
                                                         client_ca=certs / "ca.crt")))


@pytest.mark.parametrize(("cert", "key", "ca", "field"), [
    ("missing.crt", "server.key", None, "tls.certfile"),
    ("server.crt", "missing.key", None, "tls.keyfile"),
    ("server.crt", "agent.key", None, "tls.certfile"),  # another certificate's key
    ("server.key", "server.key", None, "tls.certfile"),  # a key where the certificate goes
    ("server.crt", "server.key", "missing-ca.crt", "tls.client_ca"),
    ("server.crt", "server.key", "ca.srl", "tls.client_ca"),  # not PEM
])
def test_bad_tls_files_are_named_before_the_database_is_touched(tmp_path: Path, certs: Path, cert: str, key: str,
                                                                ca: str | None, field: str) -> None:
    tls = TlsSettings(certfile=certs / cert, keyfile=certs / key, client_ca=certs / ca if ca else None)
    with pytest.raises(InvalidInput) as err:
        build(_settings(tmp_path, tls=tls), SimScheduler([]))
    assert err.value.field == field
    assert not (tmp_path / "c.db").exists()


@pytest.mark.parametrize("path", ["missing-token", "."])  # "." is what ticket_token_file = "" used to become
def test_an_unreadable_ticket_token_file_is_named(tmp_path: Path, path: str) -> None:
    repair = RepairSettings(ticket_url="https://tickets.example/hooks/gpufleet", ticket_token_file=tmp_path / path)
    with pytest.raises(InvalidInput) as err:
        build(_settings(tmp_path, repair=repair), SimScheduler([]))
    assert err.value.field == "repair.ticket_token_file"


@pytest.mark.parametrize(("setting", "name"), [("topology_file", "missing-topology.json"),
                                               ("topology_file", "."),
                                               ("policy_file", "missing-policy.toml")])
def test_a_missing_topology_or_policy_file_is_named_before_the_database_is_touched(tmp_path: Path, setting: str,
                                                                                   name: str) -> None:
    with pytest.raises(InvalidInput) as err:
        build(_settings(tmp_path, **{setting: tmp_path / name}), SimScheduler([]))
    assert err.value.field == setting and err.value.value == str(tmp_path / name)
    assert not (tmp_path / "c.db").exists()
