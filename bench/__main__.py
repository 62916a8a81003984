"""`python -m bench NAME [flags]`: run the bench NAME of `bench.BENCHES` with its flags (`--help` after NAME).

Without NAME (or with `--help`) it lists the benches. The exit status is 0, or 1 where the bench's own
`failed(report)` says the run failed (gpu: a failed attention check; serve: lost or wrong answers).
"""

from __future__ import annotations

import difflib
import importlib
import sys

from . import BENCHES


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m bench NAME [flags]   (python -m bench NAME --help: its flags)\n\nbenches:")
        for name, module in BENCHES.items():
            summary = (importlib.import_module(module).__doc__ or "").split("\n")[0]
            print(f"  {name:20s} {summary}")
        return 0
    name, flags = argv[0], argv[1:]
    if name not in BENCHES:
        near = difflib.get_close_matches(name, BENCHES, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        print(f"python -m bench: no bench {name!r}{hint}; benches: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[name])
    report = module.main(flags)
    failed = getattr(module, "failed", None)
    return 1 if failed is not None and failed(report) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
