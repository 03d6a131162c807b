"""The controller's web UI: server-rendered pages over the store and controller read paths the API uses,
signed in with the API's own tokens (decision 0061). See ``routes.py`` for the pages."""

from .routes import install

__all__ = ["install"]
