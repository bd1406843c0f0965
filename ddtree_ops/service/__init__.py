"""Service: the HTTP client of one server (client.py), what /server_info must report (server_info.py),
and the Prometheus text of /metrics (metrics_text.py).

May import: config, exceptions only.
"""
