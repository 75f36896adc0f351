"""The ``fairshare`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import yaml

from fairshare import Class, Pool


def _explain(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    for spec in doc.get("pools", []):
        pool = Pool(spec["name"], int(spec["capacity"]), spec.get("shares", {}))
        print(f"pool {pool.name}: C = {pool.capacity}")
        for team, slots in sorted(pool.reserved().items()):
            grants = [pool.acquire(team, Class.INTERACTIVE) for _ in range(slots + 1)]
            print(f"  {team:<12} reserved {slots:>3}  priorities {[g.priority for g in grants]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fairshare`` console script."""
    parser = argparse.ArgumentParser(prog="fairshare")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the allocator")
    serve.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    return _explain(args.config)


if __name__ == "__main__":
    sys.exit(main())
