"""``gpufleet controller migrate`` migrates the database ``controller serve`` would use with the same
config file, GPUFLEET_DATABASE_URL and --database-url — not a default file in the current directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.domain.errors import InvalidInput

runner = CliRunner()


def _revision(db: Path) -> str | None:
    if not db.exists():
        return None
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return None
            return conn.execute(sa.text("select version_num from alembic_version")).scalar_one()
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where the default sqlite:///gpufleet.db would land
    monkeypatch.delenv("GPUFLEET_DATABASE_URL", raising=False)


def test_the_config_files_database_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "from-config.db"
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'database_url = "sqlite:///{db}"\nscheduler = "sim"\n', encoding="utf-8")
    res = runner.invoke(app, ["controller", "migrate", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    head = _revision(db)
    assert head is not None
    assert str(db) in res.output and f"upgraded none (created) -> {head}" in res.output, res.output
    assert not (tmp_path / "gpufleet.db").exists()
    again = runner.invoke(app, ["controller", "migrate", "--config", str(cfg)])
    assert again.exit_code == 0 and f"at the newest revision ({head}): nothing to do" in again.output, again.output


def test_a_database_a_newer_release_migrated_is_refused_naming_its_revision(tmp_path: Path) -> None:
    """An operations drill: a rollback onto a database the newer release had migrated ended in a
    104-line alembic traceback. It is refused in one line, before anything is changed."""
    db = tmp_path / "g.db"
    assert runner.invoke(app, ["controller", "migrate", "--database-url", f"sqlite:///{db}"]).exit_code == 0
    head = _revision(db)
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(sa.text("update alembic_version set version_num = '9999'"))
    engine.dispose()
    res = runner.invoke(app, ["controller", "migrate", "--database-url", f"sqlite:///{db}"])
    assert isinstance(res.exception, InvalidInput), res.output
    err = res.exception
    assert (err.field, err.value) == ("database schema", "9999") and f"revision {head} or older" in err.expected
    assert _revision(db) == "9999", "nothing changed"


def test_the_environment_beats_the_file_and_the_option_beats_both(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    in_file, in_env, in_option = (tmp_path / f"{n}.db" for n in ("file", "env", "option"))
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'database_url = "sqlite:///{in_file}"\n', encoding="utf-8")  # no scheduler: not needed here
    monkeypatch.setenv("GPUFLEET_DATABASE_URL", f"sqlite:///{in_env}")
    assert runner.invoke(app, ["controller", "migrate", "--config", str(cfg)]).exit_code == 0
    assert _revision(in_env) is not None and _revision(in_file) is None
    res = runner.invoke(app, ["controller", "migrate", "--config", str(cfg), "--database-url",
                              f"sqlite:///{in_option}"])
    assert res.exit_code == 0, res.output
    assert _revision(in_option) is not None and _revision(in_file) is None


def test_without_config_the_environment_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "env-only.db"
    monkeypatch.setenv("GPUFLEET_DATABASE_URL", f"sqlite:///{db}")
    res = runner.invoke(app, ["controller", "migrate"])
    assert res.exit_code == 0, res.output
    assert _revision(db) is not None and not (tmp_path / "gpufleet.db").exists()


def test_a_missing_config_or_a_bad_url_names_what_was_given(tmp_path: Path) -> None:
    res = runner.invoke(app, ["controller", "migrate", "--config", str(tmp_path / "nope.toml")])
    assert isinstance(res.exception, InvalidInput), res.output
    assert res.exception.field == "config" and res.exception.value == str(tmp_path / "nope.toml")
    cfg = tmp_path / "controller.toml"
    cfg.write_text("database_url = 5\n", encoding="utf-8")
    res = runner.invoke(app, ["controller", "migrate", "--config", str(cfg)])
    assert isinstance(res.exception, InvalidInput), res.output
    assert res.exception.field == "database_url" and res.exception.value == 5
    assert not (tmp_path / "gpufleet.db").exists()


def test_a_misspelt_key_is_refused_not_ignored(tmp_path: Path) -> None:
    """``databse_url`` must not quietly migrate ./gpufleet.db."""
    cfg = tmp_path / "controller.toml"
    cfg.write_text(f'databse_url = "sqlite:///{tmp_path / "x.db"}"\n', encoding="utf-8")
    res = runner.invoke(app, ["controller", "migrate", "--config", str(cfg)])
    assert isinstance(res.exception, InvalidInput), res.output
    assert res.exception.field == "databse_url" and "'database_url'" in res.exception.expected
    assert not (tmp_path / "gpufleet.db").exists() and not (tmp_path / "x.db").exists()
