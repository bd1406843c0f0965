"""Engine errors: each says what is wrong and how to fix it; the CLI turns them into exit codes."""


class EngineError(Exception):
    """Base class for errors the engine reports to its user."""

    exit_code = 1


class BadInputError(EngineError, ValueError):
    """Invalid arguments or settings (exit code 2)."""

    exit_code = 2


class ModelLoadError(EngineError):
    """A model directory is missing, malformed, or does not fit its partner (exit code 2)."""

    exit_code = 2
