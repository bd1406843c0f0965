"""Hosts: the one SSH seam (ssh.py), the one place that runs Ansible (ansible.py, inventory.py), the
host probe (probe.py), read-only host queries (query.py) and the host layout (layout.py).

May import: config, exceptions, state, host_scripts/ (data). Nothing above it.
"""
