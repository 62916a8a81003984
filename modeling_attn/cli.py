"""The `attn` command line."""

from __future__ import annotations

import argparse
import json
import sys

from .presets import available_presets, load_preset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn", description="modeling-attn: attention models for transformers")
    commands = parser.add_subparsers(dest="command", required=True)
    preset = commands.add_parser("preset", help="list the model presets, or print one as a config JSON")
    preset.add_argument("name", nargs="?", help="preset to print (omit to list them)")
    args = parser.parse_args(argv)

    if args.command == "preset":
        if args.name is None:
            print("\n".join(available_presets()))
        else:
            print(json.dumps(load_preset(args.name).to_diff_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
