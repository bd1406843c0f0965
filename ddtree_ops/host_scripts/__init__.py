"""Standalone scripts copied to hosts and run with a bare python3 (standard library only).

They are files, not an API: the control side runs them (`ddtree_ops.hosts.probe`, `ddtree_ops.provision.manifest`)
and reads the one JSON document each prints. Nothing here may import from ddtree_ops.
"""
