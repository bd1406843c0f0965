"""ddtree-ops: the control side of DDTree speculative decoding deployments (never imports torch)."""

__version__ = "0.1.0"
