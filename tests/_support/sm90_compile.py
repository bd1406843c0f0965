"""Compile kernels to sm_90 PTX on a host with no GPU, in child processes sharing the cases.

The interpreter runs a kernel's Python, not Triton's compiler, so what only the compiler refuses shows first
on a GPU; Triton compiles to sm_90 PTX with its own ptxas on any host. With a cold Triton cache (CI's) each
compile is seconds to tens of seconds of one core, so the cases are shared among a process per core.
"""

from __future__ import annotations

import os
import subprocess
import sys

SHARD_ARGS = """
import itertools
import sys
shard, shards = int(sys.argv[1]), int(sys.argv[2])
_case = itertools.count()


def mine():
    '''Whether the next case is this process's (every shards-th from shard, in the script's order).'''
    return next(_case) % shards == shard
"""


def compile_in_shards(script: str, timeout_s: int = 300) -> list[str]:
    """Run `script` (SHARD_ARGS is prepended: each case it compiles asks `mine()` first) in a child process per
    core, up to 4, at once, with the interpreter off. Returns their printed lines; a child failing fails the test
    with its stderr."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    shards = max(1, min(4, os.cpu_count() or 1))
    procs = [subprocess.Popen([sys.executable, "-c", SHARD_ARGS + script, str(i), str(shards)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(shards)]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        assert proc.returncode == 0, err[-3000:]
        lines += out.split("\n")
    return lines
