"""What every ``hydractl`` command shares: the coordinator's default address, exit codes and
the operator-facing error (kept apart so the commands' modules need not import each other)."""

from __future__ import annotations

COORDINATOR_URL = "http://127.0.0.1:9000"
COORDINATOR_URL_ENV = "HYDRA_COORDINATOR_URL"

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_REJECTED = 2
EXIT_NOT_SERVING = 3
EXIT_LOAD_FAILED = 4


class CliError(Exception):
    """A failure already phrased for the operator; ``main`` prints it and exits with ``code``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
