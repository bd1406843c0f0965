"""The command line of a service on the `sglang` backend: stock SGLang's server with the DDTree plugin.

The unit runs `<env>/bin/python -c LAUNCHER <SGLang flags>`. LAUNCHER is `python -m sglang.launch_server`
with one step first: SGLang reads its API key only from `--api-key` (ServerArgs field `api_key`,
srt/arg_groups/fields/serving.py; no environment variable), and an ExecStart that expands
`${DDTREE_API_KEY}` would put the key in the process's command line, readable by every local user
in `ps` and `/proc/PID/cmdline`. The launcher adds `--api-key` from the environment (the 0600 env
file) to `sys.argv` inside the process, then runs the module exactly as `-m` does (runpy with
`alter_sys`, so multiprocessing's spawned children import `sglang.launch_server` as `-m` makes them).
The key is in neither the unit, nor release.json, nor the kernel's view of the command line.

SGLang logs its ServerArgs at startup, `api_key` included, and that would put the key in the journal. So
when a key is set, the launcher first forks a small pump (REDACTOR) that stands between the process's
stdout/stderr (inherited by every process SGLang spawns) and the journal, and replaces the key's bytes with
`<redacted>`. It is a process, not a thread, so a SIGKILLed server still gets its last lines through; it
ignores SIGTERM/SIGINT and ends when the last writer has closed its pipes.
"""

from __future__ import annotations

from ..config import Engine, Service
from ..exceptions import ConfigError

SGLANG_MODULE = "sglang.launch_server"
API_KEY_ENV = "DDTREE_API_KEY"
# What the plugin registers with `SpeculativeAlgorithm.register` (ddtree) and SGLang's own DFlash worker.
SPECULATIVE_ALGORITHMS = {"ddtree": "DDTREE", "dflash": "DFLASH"}
# Settings the DDTREE validation requires (a custom tree mask through the attention backend, one token
# per KV page, no overlap schedule); the other arms get the same so a comparison runs at equal settings.
COMMON_FLAGS = ["--disable-overlap-schedule", "--attention-backend", "triton", "--page-size", "1", "--enable-metrics"]
# SGLang's `--dtype` spelling of the project's dtypes (`auto` passes nothing: SGLang decides).
SGLANG_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


REDACTED = b"<redacted>"
# Run by the launcher (exec) when a key is set: `redact_output(key)` puts the pump between fds 1, 2 and the
# journal. No `$` or `%` (systemd would expand them in ExecStart), no quote of the other kind than repr's.
REDACTOR = """
def redact_output(key):
    import select, signal
    secret = key.encode()
    ends = [(fd, os.pipe(), os.dup(fd)) for fd in (1, 2)]
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        outs, carry = {}, {}
        for fd, (r, w), journal in ends:
            os.close(w)
            outs[r], carry[r] = journal, b""
        while outs:
            for r in select.select(list(outs), [], [])[0]:
                chunk = os.read(r, 65536)
                data = (carry[r] + chunk).replace(secret, REDACTED)
                keep = 0
                if chunk:
                    keep = next((n for n in range(min(len(secret) - 1, len(data)), 0, -1) if data.endswith(secret[:n])), 0)
                carry[r], data = data[len(data) - keep:], data[:len(data) - keep]
                while data:
                    data = data[os.write(outs[r], data):]
                if not chunk:
                    del outs[r]
        os._exit(0)
    for fd, (r, w), journal in ends:
        os.dup2(w, fd)
        for end in (r, w, journal):
            os.close(end)
"""


def launcher(module: str = SGLANG_MODULE, key_env: str = API_KEY_ENV) -> str:
    """The `python -c` program that runs `module` as `python -m` would, `--api-key $key_env` first when set.

    With a key, the process's output (and its children's) first goes through REDACTOR's pump.

    Args:
        module: the module to run as `__main__`.
        key_env: the environment variable holding the API key (unset or empty: no key is passed).
    Returns:
        one line of Python (no `$` or `%`, which systemd would expand in ExecStart).
    """
    return (
        f"import os, runpy, sys; key = os.environ.get('{key_env}'); "
        f"REDACTED = {REDACTED!r}; exec({REDACTOR!r}); key and redact_output(key); "
        "sys.argv[1:1] = ['--api-key', key] if key else []; "
        f"runpy.run_module('{module}', run_name='__main__', alter_sys=True)"
    )


def sglang_args(service: Service, engine: Engine, *, host: str) -> list[str]:
    """The arguments after `python` that start `service` under SGLang (the API key is never among them).

    `ddtree` services get `--speculative-algorithm DDTREE` and the plugin's tree flags, `dflash` SGLang's own
    `DFLASH`, `ar` no speculative flags; all get COMMON_FLAGS, then the service's extra_args verbatim.

    Args:
        service: the service (algorithm, tree settings, port, extra args).
        engine: the project's engine section (model paths, hybrid mode, dtype).
        host: the address to listen on.
    Returns:
        the argument list, `-c LAUNCHER` first.
    Raises:
        ConfigError: settings SGLang cannot run (a CPU device, the reference engine's packaged `lab` pair).
    """
    if engine.device == "cpu":
        raise ConfigError(
            "engine.device is 'cpu', but engine.backend 'sglang' runs on CUDA GPUs only: "
            "set engine.device to auto or cuda, or use engine.backend: reference"
        )
    for key in ("target", "draft"):
        if getattr(engine, key) == "lab":
            raise ConfigError(
                f"engine.{key} is 'lab', the reference engine's packaged pair, which SGLang cannot find by name: "
                f"give the model directory on the hosts (e.g. one written by `ddtree-engine make-tiny-pair`)"
            )
    args = ["-c", launcher(), "--model-path", engine.target]
    if service.algorithm in SPECULATIVE_ALGORITHMS:
        args += [
            "--speculative-algorithm", SPECULATIVE_ALGORITHMS[service.algorithm],
            "--speculative-draft-model-path", engine.draft,
        ]  # fmt: skip
    if service.algorithm == "ddtree":
        args += [
            "--speculative-ddtree-budget", str(service.budget),
            "--speculative-ddtree-topk", str(service.topk),
            "--speculative-ddtree-spine-depth", str(service.spine_depth),
            "--speculative-ddtree-hybrid-mode", engine.hybrid_mode,
        ]  # fmt: skip
        if engine.hybrid_mode == "unsafe" and engine.allow_hybrid_unsafe:
            args.append("--speculative-ddtree-allow-hybrid-unsafe")
        # DDTREE keeps SGLang's CUDA graphs, as dflash and ar do: the plugin captures a tree-masked
        # verify (lossless on the H200 with graphs at 1/1, 8/4, 15/8 and 32/8). `extra_args:
        # [--disable-cuda-graph]` runs a service eager.
    args += COMMON_FLAGS
    if engine.dtype in SGLANG_DTYPES:
        args += ["--dtype", SGLANG_DTYPES[engine.dtype]]
    args += ["--host", host, "--port", str(service.port)]
    return args + list(service.extra_args)
