"""Health: `healthcheck` of deployed services (check.py) and the `doctor` preflight (doctor.py).

May import: deploy is not needed; provision, hosts, service and the base modules.
"""
