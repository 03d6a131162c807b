"""Controller settings: one tree, loaded at the entry point only (TOML file + GPUFLEET_* environment).

Example ``controller.toml``::

    database_url = "sqlite:///gpufleet.db"      # or postgresql://user@host/db
    policy_file = "policy.toml"                # optional; defaults are documented in docs/policy.md
    topology_file = "topology.json"            # optional; enables fault correlation (docs/correlate.md)
    host = "127.0.0.1"
    port = 8470
    reconcile_interval = 1.0                   # seconds between reconciler passes
    scheduler = "slurm"                        # or "sim"; slurm drives scontrol/sinfo/squeue on this host
    slurm_conf = "/etc/slurm/slurm.conf"        # optional; otherwise the commands' default / $SLURM_CONF

    [[tokens]]
    name = "alice"
    role = "operator"
    token_sha256 = "<sha256 hex of the token>"   # or token = "..." (plain, for development only)

    [[tokens]]
    name = "agent-r01"
    role = "agent"
    token = "..."
    nodes = ["r01-*"]                           # the nodes this agent token may report for
"""

from __future__ import annotations

import hashlib
import tomllib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpufleet.domain.errors import InvalidInput


class Role(StrEnum):
    VIEWER = "viewer"  # read everything
    AGENT = "agent"  # post events, heartbeats and checkpoints for its nodes
    OPERATOR = "operator"  # viewer + manual actions (drain, resume, retire, dry-run, breaker reset)
    ADMIN = "admin"  # operator + inventory (register nodes)


class TokenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    role: Role
    token: str | None = Field(default=None, min_length=16)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    nodes: tuple[str, ...] = ("*",)

    @model_validator(mode="after")
    def _one_secret(self) -> TokenConfig:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token or token_sha256")
        return self

    @property
    def digest(self) -> str:
        if self.token_sha256 is not None:
            return self.token_sha256
        assert self.token is not None
        return hashlib.sha256(self.token.encode()).hexdigest()


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="forbid")
    database_url: str = "sqlite:///gpufleet.db"
    policy_file: Path | None = None
    topology_file: Path | None = None  # gpufleet.topology/v1: enables fault correlation
    host: str = "127.0.0.1"
    port: int = Field(default=8470, ge=0, le=65535)
    reconcile_interval: float = Field(default=1.0, gt=0)
    scheduler: str = Field(default="sim", pattern="^(sim|slurm)$")
    slurm_conf: Path | None = None  # with scheduler = "slurm": the slurm.conf the commands use (SLURM_CONF)
    tokens: tuple[TokenConfig, ...] = ()


def load_settings(path: Path | None = None, **overrides: Any) -> ControllerSettings:
    """Settings from ``path`` (TOML), then GPUFLEET_* environment variables, then ``overrides``."""
    doc: dict[str, Any] = {}
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidInput("config", str(path), "an existing TOML file") from None
        except tomllib.TOMLDecodeError as err:
            raise InvalidInput("config", str(path), f"valid TOML ({err})") from None
    doc.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ControllerSettings(**doc)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(field, first.get("input"), first["msg"]) from None
