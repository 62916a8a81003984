"""`attn push`: upload a trained model to the Hugging Face Hub (what is uploaded: `modeling_attn.api.hub`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..api.errors import FlagError
from ..api.outputs import output_folder
from .parser import parse_command
from .report import run_command


@dataclass
class PushArguments:
    """`attn push`: the flags."""

    model: str = field(metadata={"help": "folder of the trained model (attn train --output_dir)"})
    repo_id: str = field(metadata={"help": "Hub repository, user/name"})
    private: bool | None = field(
        default=None,
        metadata={
            "help": "create the repository as private (default: the Hub's default)",
            "nargs": "?",
            "const": True,
        },
    )
    revision: str | None = field(
        default=None, metadata={"help": "branch to push to, created if needed (default: main)"}
    )
    results: str | None = field(
        # the file is modeling_attn.api.hub.RESULTS_FILE (not imported here: the API imports torch)
        default=None,
        metadata={"help": "evaluation JSON for the card (default: the model folder's test_results.json)"},
    )
    token: str | None = field(
        default=None, metadata={"help": "Hub token (default: the one of `hf auth login` or HF_TOKEN)"}
    )
    commit_message: str | None = field(default=None, metadata={"help": "commit message of the upload"})
    save_to: str | None = field(
        default=None, metadata={"help": "write the files that would be uploaded into this folder, upload nothing"}
    )
    force: bool = field(
        default=False,
        metadata={
            "help": "write into a folder that holds files attn push did not write, "
            "replacing only the files it writes (nothing is deleted)"
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`attn push --model DIR --repo-id ID [--private] [--revision BRANCH] [--results FILE] [--save-to DIR]`."""
    return run_command("attn push", lambda: push(argv))


def push(argv: Sequence[str] | None) -> int:
    args = parse_command(PushArguments, argv, "attn push", "Upload a trained model to the Hugging Face Hub.")
    from ..api.hub import push_to_hub, save_for_hub
    from ..api.model_folder import check_folder

    check_folder(args.model)  # ModelFolderError: no such model folder (did you mean ...?), or a file
    try:
        validate_repo_id(args.repo_id)
    except HFValidationError as error:
        raise FlagError(f"--repo_id {args.repo_id}: {str(error).splitlines()[0]}") from None
    if args.results is not None and not Path(args.results).is_file():
        raise FlagError(f"--results {args.results}: no such file")
    if args.save_to:
        inputs = {"--model": args.model, "--results": args.results}
        with output_folder(args.save_to, "attn push", inputs, args.force, "--save_to") as staging:
            save_for_hub(args.model, staging, args.repo_id, args.results)
            written = sorted(path.name for path in staging.iterdir())
        print(f"wrote {', '.join(written)} to {args.save_to}")
        return 0
    # the Hub's answer (no network, no token, no access) is push_to_hub's one UserError line
    url = push_to_hub(
        args.model, args.repo_id, args.private, args.revision, args.token, args.results, args.commit_message
    )
    print(f"pushed {args.model} to {url}")
    return 0


__all__ = ["PushArguments", "main"]
