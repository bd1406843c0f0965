"""ddtree-engine: DDTree speculative decoding — tree build/verify, hybrid recurrent state handling,
a transformers reference backend and an OpenAI-compatible server."""

__version__ = "0.1.0"
