"""`attn push`: upload a trained model to the Hugging Face Hub (what is uploaded: `modeling_attn.hub`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..hub import RESULTS_FILE, push_to_hub, save_for_hub


def push_main(argv: list[str] | None = None) -> int:
    """`attn push --model DIR --repo-id ID [--private] [--revision BRANCH] [--results FILE] [--save-to DIR]`."""
    parser = argparse.ArgumentParser(prog="attn push", description="Upload a trained model to the Hugging Face Hub.")
    parser.add_argument("--model", required=True, help="folder of the trained model (attn train --output_dir)")
    parser.add_argument("--repo-id", "--repo_id", dest="repo_id", required=True, help="Hub repository, user/name")
    parser.add_argument("--private", action="store_true", default=None, help="create the repository as private")
    parser.add_argument("--revision", help="branch to push to (created if needed); default: main")
    parser.add_argument("--results", help=f"evaluation JSON for the card (default: the model's {RESULTS_FILE})")
    parser.add_argument("--token", help="Hub token (default: the one of `hf auth login` or HF_TOKEN)")
    parser.add_argument("--commit-message", "--commit_message", dest="commit_message")
    parser.add_argument(
        "--save-to", "--save_to", dest="save_to", help="write the files that would be uploaded here, upload nothing"
    )
    args = parser.parse_args(argv)
    if not Path(args.model).is_dir():
        parser.error(f"--model {args.model}: no such folder")
    if args.save_to:
        folder = save_for_hub(args.model, args.save_to, args.repo_id, args.results)
        print(f"wrote {', '.join(sorted(p.name for p in folder.iterdir()))} to {folder}")
        return 0
    url = push_to_hub(args.model, args.repo_id, args.private, args.revision, args.token, args.results,
                      args.commit_message)  # fmt: skip
    print(f"pushed {args.model} to {url}")
    return 0


__all__ = ["push_main"]
