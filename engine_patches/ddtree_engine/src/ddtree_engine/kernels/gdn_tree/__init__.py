"""Gated-DeltaNet over a draft tree: causal conv and gated delta recurrence, parent-indexed."""

from .reference import gated_delta_tree, node_levels, tree_causal_conv

__all__ = ["gated_delta_tree", "node_levels", "tree_causal_conv"]
