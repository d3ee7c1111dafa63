"""Run in a separate process: llama.cpp's stock ggml RPC server on 127.0.0.1:PORT, nothing in front.

The yardstick for the merged port's relay: a peer must get the same tokens through the relay as
from the stock server. (The engine's own in-process server cannot serve as that yardstick: it is
sealed behind the relay and reachable from nowhere else.)"""

from __future__ import annotations

import sys
import time

from hydrad.engine import ggml


def main() -> None:
    server = ggml.RpcServerThread("127.0.0.1", int(sys.argv[1]), None, 1)
    server.start()
    while server.alive:
        time.sleep(0.2)
    sys.exit(server.error or "the ggml RPC server stopped")


if __name__ == "__main__":
    main()
