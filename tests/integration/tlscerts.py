"""Throwaway certificates for the TLS tests, made with the openssl command line.

``standard(d)``: a CA (ca.crt/ca.key), a server certificate for 127.0.0.1 (server.crt/key: a
subjectAltName and no extendedKeyUsage, so OpenSSL accepts it for either end) and an agent's client
certificate (agent.crt/key). ``issue`` makes more: other CAs, certificates limited to one purpose.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import require_service

SERVER_SAN = "subjectAltName=IP:127.0.0.1"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str = "ca") -> None:
    """A self-signed CA: ``name``.crt and ``name``.key."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=test-{name}",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def issue(d: Path, name: str, cn: str, *, ca: str = "ca", ext: str = "") -> None:
    """``name``.crt/.key for ``cn``, signed by the CA ``ca``; ``ext``: extension lines (openssl x509 -extfile)."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", cwd=d)
    extfile = []
    if ext:
        (d / f"{name}.ext").write_text(ext + "\n", encoding="utf-8")
        extfile = ["-extfile", f"{name}.ext"]
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.crt", *extfile, cwd=d)


def standard(d: Path) -> Path:
    require_service(shutil.which("openssl") is not None, "the openssl command")
    d.mkdir(parents=True, exist_ok=True)
    make_ca(d)
    issue(d, "server", "127.0.0.1", ext=SERVER_SAN)
    issue(d, "agent", "agent-r01")
    return d
