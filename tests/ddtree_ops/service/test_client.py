"""ServiceClient internals that the healthcheck's threads rely on."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ddtree_ops.service import client as client_module


def test_clients_built_at_once_on_many_threads_build_one_tls_context(monkeypatch):
    # Each real build reads the CA bundle (~20 ms of CPU); a healthcheck builds one client per service,
    # all at once on its threads. The stand-in build is slow, so threads that did not wait would each build.
    builds = []

    def slow_build():
        time.sleep(0.05)
        builds.append(object())
        return builds[-1]

    monkeypatch.setattr(client_module.httpx, "create_ssl_context", slow_build)
    monkeypatch.setattr(client_module, "_TLS", [])
    start = threading.Barrier(16)

    def build(_):
        start.wait()
        return client_module._tls_context()

    with ThreadPoolExecutor(16) as pool:
        contexts = list(pool.map(build, range(16)))
    assert len(builds) == 1 and all(c is builds[0] for c in contexts)
