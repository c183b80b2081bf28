"""`python -m queue_server.store.sql [--write]`: check or regenerate the rendered SQL files."""

from __future__ import annotations

import argparse
import sys

from queue_server.store import sql


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m queue_server.store.sql",
        description="Check (default) or rewrite queue_server/store/sql/*.sql from the code.",
    )
    parser.add_argument("--write", action="store_true", help="rewrite the files from the code")
    args = parser.parse_args(argv)
    if args.write:
        changed = sql.write()
        print(f"wrote {len(changed)} file(s): {', '.join(changed) or 'none changed'}")
        return 0
    stale = sql.differences()
    if stale:
        print(
            f"out of date: {', '.join(stale)}; run `python -m queue_server.store.sql --write`",
            file=sys.stderr,
        )
        return 1
    print("queue_server/store/sql/*.sql match the code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
