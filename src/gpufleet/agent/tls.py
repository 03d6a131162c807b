"""The agent's side of TLS to the controller: which CA to trust and which client certificate to show.

``[tls]`` on the controller (docs/api.md#tls) serves HTTPS and may require client certificates signed by
a CA of the site's choosing. The agent's three settings match it: ``ca_file`` (the CA bundle that signed
the controller's certificate; unset: the system's trust store), and ``client_cert`` with ``client_key``
(the node's certificate, when the controller asks for one). Every HTTP client of the agent (event push,
heartbeats, inventory, repair commands, bundle upload) uses the one context built here.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.domain.errors import InvalidInput

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def client_tls(controller: str, ca_file: Path | None = None, client_cert: Path | None = None,
               client_key: Path | None = None) -> ssl.SSLContext | bool:
    """What ``httpx`` takes as ``verify``: ``True`` (the system store) or a context with the site CA and
    the client certificate. Raises :class:`InvalidInput` naming the setting that cannot be used."""
    if (client_cert is None) != (client_key is None):
        given, missing = ("client_cert", "client_key") if client_key is None else ("client_key", "client_cert")
        raise InvalidInput(missing, None, f"a PEM file, since {given} is set (a client certificate needs both)")
    scheme = urlsplit(controller).scheme
    if scheme != "https":
        for name, value in (("ca_file", ca_file), ("client_cert", client_cert)):
            if value is not None:
                raise InvalidInput(name, str(value), f"unset, or a controller URL with https:// (it is {controller})")
        if scheme == "http" and urlsplit(controller).hostname not in _LOOPBACK:  # (not a URL: push.py says so)
            log.warning("the controller URL %s is plain HTTP: this node's bearer token crosses the network "
                        "in clear; serve the controller with [tls] and use https:// (docs/api.md#tls)", controller)
        return True
    if ca_file is None and client_cert is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except OSError as err:
        raise InvalidInput("ca_file", str(ca_file), f"a readable PEM bundle of CA certificates ({_why(err)})") from None
    if client_cert is not None and client_key is not None:
        try:
            ctx.load_cert_chain(str(client_cert), str(client_key))
        except OSError as err:
            raise InvalidInput("client_cert", str(client_cert),
                               f"a readable PEM certificate matching client_key {client_key} ({_why(err)})") from None
    return ctx


def _why(err: OSError) -> str:
    return str(err) if isinstance(err, ssl.SSLError) else (err.strerror or str(err))
