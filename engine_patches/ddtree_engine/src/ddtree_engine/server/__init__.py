"""OpenAI-compatible HTTP server over the reference engine (`ddtree-engine serve`)."""

from .app import ServerSettings, create_app
from .command import serve

__all__ = ["ServerSettings", "create_app", "serve"]
