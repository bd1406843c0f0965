"""Standalone scripts copied to hosts and run with a bare python3 (standard library only).

They are files, not an API: the control side runs them (`ddtree_ops.probe`, `ddtree_ops.manifest`)
and reads the one JSON document each prints. Nothing here may import from ddtree_ops.
"""
