"""The errors library code raises; only the CLI turns them into messages and exit codes."""


class DdtreeOpsError(Exception):
    """Base class. `exit_code` is what the CLI exits with."""

    exit_code = 1


class ConfigError(DdtreeOpsError):
    """Bad input: a malformed project file or command-line arguments. Nothing was touched."""

    exit_code = 2


class HostError(DdtreeOpsError):
    """A host failed (unreachable, a playbook failed, a health gate failed)."""

    exit_code = 1


class CheckFailed(DdtreeOpsError):
    """A check ran and found a problem."""

    exit_code = 1


class HostKeyError(HostError):
    """A host's SSH key is not recorded in the project's known_hosts, or differs from the one recorded:
    nothing was run on it (`ddtree-ops hosts trust HOST [--replace]` records it)."""

    exit_code = 1
