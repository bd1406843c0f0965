"""Provision: from host facts to a lock (resolve.py, lock.py, cuda_lock.py), its wheelhouse, closure,
container image and install commands, the ABI manifest, and the provision run itself (run.py).

May import: hosts, lab (the lab base image), service is not needed; config, exceptions, state, knowledge.
"""
