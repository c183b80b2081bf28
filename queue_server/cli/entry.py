"""The `queue-server` command's entry point: the CLI imported with the garbage collector off.

Importing the CLI makes about 90,000 objects (modules, classes, the SDK's models) and none
of them is garbage: each collection the import set off walked all those made before it, a
sixth of every command's start. After the import they are frozen (`gc.freeze`): a later
collection, in `serve` or `work` that run for days, no longer walks them either.
"""

from __future__ import annotations

import gc


def main() -> None:
    gc.disable()
    try:
        from queue_server.cli.main import app
    finally:
        gc.freeze()
        gc.enable()
    app()
