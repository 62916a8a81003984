"""The recipe on the Hugging Face Hub (`attn train --push_to_hub`): the repository and the checkpoint pushes.

The repository is created before any work (`create_hub_repo`, as Trainer's `init_hf_repo`); the checkpoint pushes of
`--hub_strategy` (`CheckpointPush`, a `TrainerCallback`) each carry the files of `attn push`
(`modeling_attn.api.hub.save_for_hub`: weights, code, tokenizer, generation config, card) instead of Trainer's raw
folder. The final model is pushed by the recipe after the test, with its scores in the card
(`train.TrainingRun.push`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from huggingface_hub import HfApi
from transformers import Seq2SeqTrainingArguments, TrainerCallback, TrainerControl, TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy
from transformers.utils.hub import PushInProgress

from modeling_attn.api.errors import UserError
from modeling_attn.api.hub import save_for_hub


class HubSetupError(UserError, RuntimeError):
    """--push_to_hub, but the Hub repository cannot be created: refused before any work."""


def create_hub_repo(repo_id: str, private: bool | None, revision: str | None, token: str | None) -> None:
    """Create the repository `repo_id` (--hub_private_repo `private`) and the branch --hub_revision `revision` if
    needed, as Trainer's `init_hf_repo` does before any work; HubSetupError, with the way out, when it cannot be
    (offline, not logged in, no such organisation)."""
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
    except OSError as error:  # huggingface_hub's errors are OSErrors
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise HubSetupError(
            f"--push_to_hub: cannot create the Hub repository {repo_id} ({reason}); log in (`hf auth login`), "
            "or leave --push_to_hub out and run `attn push` later"
        ) from error


def hub_uploads(strategy: HubStrategy | str, checkpoint: Path, model_folder: Path) -> list[tuple[Path, str | None]]:
    """The uploads of one checkpoint save for `--hub_strategy`, as transformers documents the strategies: (folder,
    path in the repository, None for its root). `model_folder` holds the checkpoint's model as `save_for_hub` wrote it.

    end: none (the final model is pushed after training); every_save: the model; checkpoint: the model, and the
    checkpoint (optimizer, scheduler, trainer state: what resuming needs) as `last-checkpoint`; all_checkpoints: the
    model, and the checkpoint under its own name.
    """
    strategy = HubStrategy(strategy)
    if strategy == HubStrategy.END:
        return []
    uploads: list[tuple[Path, str | None]] = [(model_folder, None)]
    if strategy == HubStrategy.CHECKPOINT:
        uploads.append((checkpoint, "last-checkpoint"))
    elif strategy == HubStrategy.ALL_CHECKPOINTS:
        uploads.append((checkpoint, checkpoint.name))
    return uploads


class CheckpointPush(TrainerCallback):
    """At each checkpoint save (`on_save`: the checkpoint folder is complete and in place), push to `repo_id` as
    `--hub_strategy` says (`hub_uploads`), from the main process, as Trainer's own `_push_from_checkpoint` does:
    the uploads run in the background; a save while one runs is skipped unless --hub_always_push; the last one is
    waited for at the end of training (`on_train_end`). Trainer's own pushes stay off (`args.push_to_hub` False).
    """

    def __init__(self, repo_id: str):
        self.repo_id = repo_id
        self.push_in_progress: PushInProgress | None = None
        self._folders: list[tempfile.TemporaryDirectory] = []  # what the running uploads read

    def on_save(self, args: Seq2SeqTrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if not state.is_world_process_zero or args.hub_strategy == HubStrategy.END:
            return
        running = self.push_in_progress is not None and not self.push_in_progress.is_done()
        if running and not args.hub_always_push:
            return
        if not running:
            for folder in self._folders:
                folder.cleanup()
            self._folders = []
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        staged = tempfile.TemporaryDirectory(prefix="attn-push-")
        self._folders.append(staged)
        save_for_hub(checkpoint, staged.name, self.repo_id)
        message = f"Training in progress, step {state.global_step}"
        jobs = [
            self.upload(args, folder, path_in_repo, message + (", checkpoint" if path_in_repo else ""))
            for folder, path_in_repo in hub_uploads(args.hub_strategy, checkpoint, Path(staged.name))
        ]
        if running:  # --hub_always_push: all of them are waited for at the end
            self.push_in_progress.jobs.extend(jobs)
        else:
            self.push_in_progress = PushInProgress(jobs)

    def upload(self, args: Seq2SeqTrainingArguments, folder: Path, path_in_repo: str | None, message: str):
        """One folder uploaded in the background: a future (huggingface_hub's `run_as_future`)."""
        api = HfApi(token=args.hub_token)
        return api.upload_folder(
            repo_id=self.repo_id,
            folder_path=folder,
            path_in_repo=path_in_repo,
            commit_message=message,
            revision=args.hub_revision,
            run_as_future=True,
        )

    def on_train_end(self, args: Seq2SeqTrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.push_in_progress is not None and not self.push_in_progress.is_done():
            self.push_in_progress.wait_until_done()


__all__ = ["CheckpointPush", "HubSetupError", "create_hub_repo", "hub_uploads"]
