"""OpenAI-compatible HTTP server over any `types.Engine`; `ddtree-engine serve` runs it over the reference backend."""

from .app import ServerSettings, create_app
from .command import serve

__all__ = ["ServerSettings", "create_app", "serve"]
