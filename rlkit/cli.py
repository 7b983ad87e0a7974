"""The ``rlkit`` command. Sub-commands arrive with the capabilities behind them; today: ``rlkit methods``."""

from __future__ import annotations

import argparse
import json
import sys

from rlkit import __version__


def _methods(args: argparse.Namespace) -> int:
    from rlkit.registry import get_advantage, get_policy_loss, list_methods

    names = list_methods()
    if args.json:
        print(json.dumps(names, indent=2))
        return 0
    for kind, getter in (("advantage", get_advantage), ("policy_loss", get_policy_loss)):
        print(f"{kind}:")
        for name in names[kind]:
            fn = getter(name)
            summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
            print(f"  {name:<12} {fn.__module__}.{fn.__name__}  {summary}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rlkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("methods", help="list the registered advantage estimators and policy losses")
    p.add_argument("--json", action="store_true", help="print the names as JSON")
    p.set_defaults(func=_methods)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
