"""What `attn train` does with its --output_dir when something is wrong (issue 34; training/validate.py,
training/train.py, training/trainer.py, modeling_attn/api/outputs.py):
- a checkpoint to resume with a damaged file (cut short, altered): refused before any work, naming the file and the
  previous whole checkpoint with the flag that resumes from it;
- a folder holding files attn train did not write (a README of the user's, another model): refused unless
  --overwrite_output_dir, which replaces only attn train's files; a folder attn train wrote is not refused;
- a disk that fills during a checkpoint save (a real tmpfs, as root: tests/full_disk.py): "No space left on device",
  the folder and the last whole checkpoint, no partial checkpoint left.
Real files (torch.save, safetensors, JSON) cut short with truncate, and real in-process `attn train` runs of a
tiny model (about a second each)."""

from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from full_disk import small_tmpfs
from modeling_attn.training.validate import damaged_file
from runs import NO_EVAL, tiny_on
from safetensors.torch import save_file

from modeling_attn.api.outputs import MANIFEST, is_disk_full, record_written
from modeling_attn.cli.main import main as attn
from modeling_attn.cli.train import parse_args

TINY = [*tiny_on(60), *NO_EVAL, "--save_steps", "2"]


def fake_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A checkpoint folder of real files of each kind a Trainer checkpoint holds."""
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    save_file({"weight": torch.randn(64, 64, generator=generator)}, folder / "model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.randn(64, 64, generator=generator)}}}, folder / "optimizer.pt")
    torch.save({"python": 1}, folder / "rng_state.pth")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": int(folder.name.split("-")[-1])}))
    return folder


def cut_short(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def error_line(argv: list[str], capsys) -> str:
    try:
        status = attn(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    return err.splitlines()[-1]


@pytest.mark.parametrize(
    ("name", "damage", "reason"),
    [
        ("model.safetensors", cut_short, r"not a whole safetensors file: .*incomplete metadata"),
        ("optimizer.pt", cut_short, r"not a whole torch\.save archive: File is not a zip file"),
        ("rng_state.pth", cut_short, r"not a whole torch\.save archive"),
        ("trainer_state.json", cut_short, r"not a whole JSON file: .*line 1 column"),
    ],
)
def test_a_damaged_file_is_found_with_its_reader_s_reason(tmp_path, name, damage, reason):
    checkpoint = fake_checkpoint(tmp_path / "checkpoint-4")
    assert damaged_file(checkpoint) is None
    damage(checkpoint / name)
    file, why = damaged_file(checkpoint)
    assert file == checkpoint / name and re.search(reason, why), why


def test_a_byte_altered_inside_a_torch_save_archive_fails_its_crc(tmp_path):
    checkpoint = fake_checkpoint(tmp_path / "checkpoint-4")
    data = bytearray((checkpoint / "optimizer.pt").read_bytes())
    with zipfile.ZipFile(checkpoint / "optimizer.pt") as archive:  # a byte in the middle of the tensor's data
        member = max(archive.infolist(), key=lambda info: info.file_size)
        offset = member.header_offset + 30 + len(member.filename.encode()) + len(member.extra) + member.file_size // 2
    data[offset] ^= 0xFF
    (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    file, why = damaged_file(checkpoint)
    assert file.name == "optimizer.pt" and f"{member.filename} fails its CRC check" in why


def test_resuming_a_damaged_checkpoint_names_the_file_and_the_previous_whole_one(tmp_path):
    out = tmp_path / "out"
    for step in (2, 4, 6):
        fake_checkpoint(out / f"checkpoint-{step}", seed=step)
    cut_short(out / "checkpoint-6" / "optimizer.pt")
    (out / "checkpoint-4" / "trainer_state.json").write_text("{")  # damaged too: the way out skips it
    argv = ["--output_dir", str(out), "--resume_from_checkpoint", "last", *TINY]
    with pytest.raises(ValueError) as error:
        parse_args(argv)
    assert str(error.value) == (
        f"--resume_from_checkpoint {out}/checkpoint-6: {out}/checkpoint-6/optimizer.pt is damaged (not a whole "
        f"torch.save archive: File is not a zip file); the previous whole checkpoint is {out}/checkpoint-2: move "
        f"{out}/checkpoint-6 out of {out} and resume with --resume_from_checkpoint {out}/checkpoint-2"
    )
    cut_short(out / "checkpoint-2" / "model.safetensors")
    with pytest.raises(ValueError, match=rf"no earlier checkpoint of {out} is whole: start again"):
        parse_args(argv)
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint .*elsewhere: no such folder"):
        parse_args(["--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", str(tmp_path / "elsewhere")])


def test_a_real_run_resumed_from_a_cut_checkpoint_is_refused_and_the_way_out_works(tmp_path, capsys):
    out = tmp_path / "out"
    assert attn(["train", "--output_dir", str(out), *TINY, "--max_steps", "4"]) == 0
    cut_short(out / "checkpoint-4" / "model.safetensors")
    line = error_line(
        ["train", "--output_dir", str(out), *TINY, "--max_steps", "6", "--resume_from_checkpoint", "last"], capsys
    )
    assert line.startswith(
        f"attn train: error: --resume_from_checkpoint {out}/checkpoint-4: {out}/checkpoint-4/"
        "model.safetensors is damaged (not a whole safetensors file"
    )
    assert line.endswith(f"resume with --resume_from_checkpoint {out}/checkpoint-2")
    shutil.move(out / "checkpoint-4", tmp_path / "checkpoint-4-damaged")  # the way out, as the message says
    assert (
        attn(
            [
                "train",
                "--output_dir",
                str(out),
                *TINY,
                "--max_steps",
                "6",
                "--resume_from_checkpoint",
                str(out / "checkpoint-2"),
            ]
        )
        == 0
    )
    assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6


def test_a_folder_with_files_attn_train_did_not_write_is_refused_unless_told(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "model.safetensors").write_bytes(b"another model")
    argv = ["--output_dir", str(out), *TINY]
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"--output_dir {out} holds files that attn train did not write "
            "(README.md, model.safetensors); choose an empty or new folder, "
            "or give --overwrite_output_dir"
        ),
    ):
        parse_args(argv)
    parse_args([*argv, "--overwrite_output_dir"])  # told
    record_written(out, 0)  # as if attn train had written them: not refused
    parse_args(argv)
    (out / "README.md").write_text("edited since\n")  # a file of ours changed since is the user's
    with pytest.raises(ValueError, match=r"holds files that attn train did not write \(README\.md\)"):
        parse_args(argv)
    (out / "README.md").unlink()
    (out / MANIFEST).unlink()
    (out / "checkpoint-2").mkdir()  # an earlier run's checkpoints are the checkpoint rule's (resume or overwrite)
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"holds checkpoints of an earlier run \(checkpoint-2\)"):
        parse_args(argv)


def test_a_real_run_keeps_the_users_files_and_a_second_run_is_not_refused_its_own(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    quiet = [*TINY, "--max_steps", "2", "--save_strategy", "no"]
    line = error_line(["train", "--output_dir", str(out), *quiet], capsys)
    assert "holds files that attn train did not write (README.md)" in line
    assert sorted(path.name for path in out.iterdir()) == ["README.md"]  # refused before any work
    assert attn(["train", "--output_dir", str(out), *quiet, "--overwrite_output_dir"]) == 0
    assert (out / "README.md").read_text() == "my notes\n" and (out / "model.safetensors").is_file()
    (out / "README.md").unlink()
    assert attn(["train", "--output_dir", str(out), *quiet]) == 0  # only its own files there now


def test_writers_that_do_not_say_enospc_are_known_on_a_full_disk(tmp_path):
    """torch.save on a full disk raises `[enforce fail at inline_container.cc]` without the cause; safetensors says
    it in words; open() raises ENOSPC. Each is a full disk; the same torch error on a disk with room is not."""
    with small_tmpfs(tmp_path / "disk", "128k") as disk:
        tensors = {"weight": torch.zeros(1 << 17)}
        for write in (
            lambda: torch.save(tensors, disk / "a.pt"),
            lambda: save_file(tensors, disk / "a.safetensors"),
            lambda: (disk / "a.json").write_text("x" * (1 << 20)),
        ):
            with pytest.raises(Exception) as error:
                write()
            assert is_disk_full(error.value, disk), error.value
        assert not is_disk_full(RuntimeError("[enforce fail at inline_container.cc:1] . unexpected pos"), tmp_path)


def test_a_disk_that_fills_during_a_checkpoint_save_is_named_with_the_last_whole_checkpoint(tmp_path, capsys):
    # the tokenizer and one checkpoint (~480 kB) fit, a second one does not
    with small_tmpfs(tmp_path / "disk", "700k") as disk:
        out = disk / "run"
        line = error_line(["train", "--output_dir", str(out), *TINY, "--max_steps", "4"], capsys)
        assert line == (
            f"attn train: error: No space left on device while saving checkpoint-4 into {out}; the last "
            f"whole checkpoint is {out}/checkpoint-2: free some space and resume from it with "
            f"--resume_from_checkpoint {out}/checkpoint-2"
        )
        assert sorted(path.name for path in out.glob("*checkpoint*")) == ["checkpoint-2"]  # no partial one
        assert damaged_file(out / "checkpoint-2") is None


def test_a_run_that_fails_before_writing_leaves_no_folder_it_created(tmp_path, capsys):
    """Bad data found after the output folder was made: the folders the run created go again; one that was there
    stays, and so does a folder it wrote into."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.en").write_text("a b\n\nc d\n")  # an empty sentence on line 2
        (data / f"{split}.de").write_text("x y\nz\nw v\n")
    flags = ["train", "--data", str(data), "--source_lang", "en", "--target_lang", "de"]
    assert attn([*flags, "--output_dir", str(tmp_path / "new" / "deep" / "out")]) == 2
    assert "empty source sentence" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    assert attn([*flags, "--output_dir", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()  # not created by the run: kept
