"""modeling_attn/api/outputs.py: outputs appear whole or not at all, are never an input, never replace a file this
package did not write (unless told), have one writer at a time, and name a full disk. Real faults: an exception in
the middle of a write, a second process holding the lock, a dead process's lock, a tmpfs that fills up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from full_disk import small_tmpfs

from modeling_attn.api.outputs import (
    LOCK,
    OutputError,
    check_apart,
    check_not_in_use,
    folder_lock,
    foreign_files,
    output_file,
    output_folder,
    record_written,
    written_files_record,
)


def test_a_file_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out.txt"
    with output_file(target) as handle:
        handle.write("first\n")
    assert target.read_text() == "first\n"
    with pytest.raises(RuntimeError), output_file(target) as handle:
        handle.write("half of the second")
        raise RuntimeError("killed in the middle")
    assert target.read_text() == "first\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.txt"]  # no temporary left, no record beside it


def test_an_existing_file_is_replaced_only_if_ours_or_told(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own words")
    with pytest.raises(OutputError, match=r"notes.txt already exists; pass --overwrite"), output_file(mine) as handle:
        handle.write("x")
    assert mine.read_text() == "the user's own words"
    with output_file(mine, overwrite=True) as handle:
        handle.write("replaced, as told")
    assert mine.read_text() == "replaced, as told"
    with output_file(mine) as handle:  # now ours and unchanged: a second run may replace it
        handle.write("run 2")
    mine.write_text("edited by the user after the run")  # changed since: theirs again
    with pytest.raises(OutputError, match="already exists"), output_file(mine) as handle:
        handle.write("run 3")


def test_permissions_of_a_replaced_file_are_kept(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o640)
    with output_file(target, overwrite=True) as handle:
        handle.write("new")
    assert target.stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("refs.de", "is --references_file"),
        ("model/scores.json", "is inside --model"),
    ],
)
def test_an_output_is_never_an_input(tmp_path, output, message):
    (tmp_path / "model").mkdir()
    (tmp_path / "refs.de").write_text("a reference\n")
    inputs = {"--model": tmp_path / "model", "--references_file": tmp_path / "refs.de"}
    with pytest.raises(OutputError, match=message):
        check_apart(tmp_path / output, inputs)
    assert (tmp_path / "refs.de").read_text() == "a reference\n"


def test_a_folder_with_files_we_did_not_write_is_refused_and_force_replaces_only_ours(tmp_path):
    target = tmp_path / "run"
    target.mkdir()
    (target / "README.md").write_text("my notes")
    (target / "config.json").write_text('{"model_type": "attn_rnn"}')  # another model
    with (
        pytest.raises(OutputError, match=r"holds files that attn average did not write \(README.md, config.json\)"),
        output_folder(target, "attn average") as staging,
    ):
        (staging / "config.json").write_text("{}")
    assert (target / "config.json").read_text() == '{"model_type": "attn_rnn"}'
    with output_folder(target, "attn average", force=True) as staging:
        (staging / "config.json").write_text('{"model_type": "attn_transformer"}')
        (staging / "model.safetensors").write_bytes(b"weights")
    assert (target / "README.md").read_text() == "my notes"  # never deleted, never replaced
    assert (target / "config.json").read_text() == '{"model_type": "attn_transformer"}'
    assert foreign_files(target) == ["README.md"]  # what we wrote is recorded as ours


def test_a_second_write_replaces_what_the_first_wrote_and_a_failed_one_changes_nothing(tmp_path):
    target = tmp_path / "sub" / "model"  # parents are created
    with output_folder(target, "attn convert") as staging:
        (staging / "config.json").write_text("v1")
        (staging / "tokenizer").mkdir()
        (staging / "tokenizer" / "vocab.json").write_text("{}")
    with output_folder(target, "attn convert") as staging:
        (staging / "config.json").write_text("v2")
    assert (target / "config.json").read_text() == "v2"
    assert (target / "tokenizer" / "vocab.json").read_text() == "{}"
    with pytest.raises(RuntimeError), output_folder(target, "attn convert") as staging:
        (staging / "config.json").write_text("v3, never finished")
        raise RuntimeError("failed while saving")
    assert (target / "config.json").read_text() == "v2"
    assert not [path for path in target.parent.iterdir() if "staging" in path.name]
    assert not (target / LOCK).exists()


def test_a_folder_another_writer_filled_is_another_model_and_needs_force(tmp_path):
    """A folder attn itself wrote, but as another run or from other inputs, is never replaced without force."""
    run = tmp_path / "rnn-run"
    run.mkdir()
    started = os.stat(run).st_mtime_ns
    (run / "config.json").write_text('{"model_type": "attn_rnn"}')
    record_written(run, started)  # what `attn train --output_dir rnn-run` records of its own files
    model = tmp_path / "model"
    model.mkdir()
    with pytest.raises(OutputError) as refused, output_folder(run, "attn average", {"input 1": model}):
        pass
    assert str(refused.value) == (
        f"--output_dir {run} holds another model, written by `attn train --output_dir {run.resolve()}` "
        "(config.json); choose an empty or new folder, or pass --force to replace its files"
    )
    assert json.loads((run / "config.json").read_text()) == {"model_type": "attn_rnn"}
    with output_folder(run, "attn average", {"input 1": model}, force=True) as staging:
        (staging / "config.json").write_text('{"model_type": "attn_transformer"}')
    # the same command from the same inputs replaces its own output; from other inputs it is refused
    with output_folder(run, "attn average", {"input 1": model}) as staging:
        (staging / "config.json").write_text('{"model_type": "attn_transformer", "again": true}')
    other = tmp_path / "other"
    other.mkdir()
    expected = rf"holds another model, written by `attn average {model.resolve()}`"
    with pytest.raises(OutputError, match=expected), output_folder(run, "attn average", {"input 1": other}):
        pass
    assert json.loads((run / "config.json").read_text()) == {"model_type": "attn_transformer", "again": True}


def test_a_lone_output_file_leaves_no_record_beside_it_and_is_still_replaced_as_ours(tmp_path):
    target = tmp_path / "page.html"
    with output_file(target) as handle:
        handle.write("first")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["page.html"]
    assert str(target.resolve()) in json.loads(written_files_record().read_text())["files"]
    with output_file(target) as handle:  # ours, unchanged since: replaced without --overwrite
        handle.write("second")
    assert target.read_text() == "second"
    target.write_text("the user's edit")
    with pytest.raises(OutputError, match="already exists; pass --overwrite"), output_file(target) as handle:
        handle.write("third")
    assert target.read_text() == "the user's edit"


def test_a_failed_first_write_leaves_no_folder(tmp_path):
    with pytest.raises(RuntimeError), output_folder(tmp_path / "new", "attn export"):
        raise RuntimeError("failed")
    assert not (tmp_path / "new").exists()
    with pytest.raises(RuntimeError), output_folder(tmp_path / "runs" / "a" / "new", "attn export"):
        raise RuntimeError("failed")
    assert list(tmp_path.iterdir()) == []  # nor the folders above it that it created
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError), output_folder(tmp_path / "mine" / "new", "attn export"):
        raise RuntimeError("failed")
    assert [path.name for path in tmp_path.iterdir()] == ["mine"]  # a folder that was there stays


def test_a_second_process_is_refused_with_the_first_ones_pid(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "README.md").write_text("the user's")  # before the holder's run
    holder = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from modeling_attn.api.outputs import folder_lock
        with folder_lock({str(folder)!r}, "attn train"):
            Path({str(folder)!r}, "tokenizer.json").write_text("{{}}")
            print("locked", flush=True)
            time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        with (
            pytest.raises(OutputError, match=rf"in use by process {process.pid} \(attn train\)"),
            folder_lock(folder, "attn average"),
        ):
            pass
        with pytest.raises(OutputError, match=rf"in use by process {process.pid} \(attn train\)"):
            check_not_in_use(folder)  # the same answer before any work
    finally:
        process.kill()  # SIGKILL: its lock stays, and what it wrote is not recorded
        process.wait()
    assert sorted(foreign_files(folder)) == ["README.md", "tokenizer.json"]
    check_not_in_use(folder)  # a dead holder: what it wrote since taking the lock is its command's, not the user's
    assert list(foreign_files(folder)) == ["README.md"]
    with folder_lock(folder, "attn average"):  # the holder is gone: its lock is taken over
        assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
    assert not (folder / LOCK).exists()


def test_a_full_disk_is_named_and_the_target_is_left_as_it_was(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        model = disk / "model"
        with output_folder(model, "attn average") as staging:
            (staging / "model.safetensors").write_bytes(b"old weights")
        with (
            pytest.raises(OutputError, match=rf"No space left on device while writing {model}"),
            output_folder(model, "attn average") as staging,
        ):
            (staging / "model.safetensors").write_bytes(os.urandom(1 << 20))
        assert (model / "model.safetensors").read_bytes() == b"old weights"
        with (
            pytest.raises(OutputError, match="No space left on device"),
            output_file(disk / "translations.txt") as handle,
        ):
            handle.write("x" * (1 << 20))
        assert not (disk / "translations.txt").exists()
