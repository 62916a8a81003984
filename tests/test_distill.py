"""`attn distill` (issue 57): sequence-level distillation data, checked against the teacher's own translations and
read back by the recipe's data loader as `attn train --data` reads it."""

from __future__ import annotations

import pytest
from tasks import one_thread
from test_engines import SENTENCES, save_reverser

from modeling_attn.api.engines import load_translator
from modeling_attn.cli.main import main as cli


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    with one_thread():
        return save_reverser(tmp_path_factory.mktemp("teacher"))


def reversed_words(sentence: str) -> str:
    return " ".join(sentence.split()[::-1])


def data_folder(folder, train: list[str]) -> None:
    folder.mkdir()
    (folder / "train.a").write_text("".join(f"{s}\n" for s in train))
    (folder / "train.b").write_text("".join(f"{reversed_words(s)}\n" for s in train))
    (folder / "val.a").write_text("a b\nc d\n")
    (folder / "val.b").write_text("b a\nd c\n")
    (folder / "test_set.a").write_text("e f\n")
    (folder / "test_set.b").write_text("f e\n")


def test_the_distilled_folder_holds_the_teacher_s_translations_and_the_real_splits(teacher, tmp_path, capsys):
    from modeling_attn.training.data import load_parallel_data

    data, out = tmp_path / "data", tmp_path / "distilled"
    data_folder(data, SENTENCES[:10])
    common = ["distill", "--model", str(teacher), "--data", str(data), "--source_lang", "a", "--target_lang", "b"]
    assert cli([*common, "--output_dir", str(out), "--engine", "torch", "--no_progress", "--num_beams", "3"]) == 0
    expected = load_translator(str(teacher), engine="torch").translate_batch(SENTENCES[:10], num_beams=3)
    assert (out / "train.a").read_text().splitlines() == SENTENCES[:10]
    assert (out / "train.b").read_text().splitlines() == expected
    assert (out / "val.b").read_text() == "b a\nd c\n" and (out / "test_set.a").read_text() == "e f\n"
    assert "10 training sources translated, 10 pairs written" in capsys.readouterr().err
    parallel = load_parallel_data(str(out), "a", "b")
    assert list(parallel.splits["train"]["target"]) == expected
    assert list(parallel.splits["test"]["target"]) == ["f e"]
    mixed = tmp_path / "mixed"
    assert cli([*common, "--output_dir", str(mixed), "--engine", "torch", "--no_progress", "--keep_original"]) == 0
    originals = [reversed_words(s) for s in SENTENCES[:10]]
    teacher_side = load_translator(str(teacher), engine="torch").translate_batch(SENTENCES[:10])
    assert (mixed / "train.a").read_text().splitlines() == SENTENCES[:10] * 2
    assert (mixed / "train.b").read_text().splitlines() == teacher_side + originals


def test_attn_distill_refuses_what_it_cannot_use(teacher, tmp_path, capsys):
    data = tmp_path / "data"
    data_folder(data, SENTENCES[:3] + [" ".join(["a"] * 40)])
    common = ["distill", "--model", str(teacher), "--source_lang", "a", "--target_lang", "b", "--no_progress"]
    assert cli([*common, "--data", str(tmp_path / "none"), "--output_dir", str(tmp_path / "o")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert cli([*common, "--data", str(data), "--output_dir", str(tmp_path / "o"), "--engine", "torch"]) == 2
    assert f"{data}/train:4: the source" in capsys.readouterr().err
    assert not (tmp_path / "o" / "train.a").exists()  # nothing written on failure
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine\n")
    (data / "train.a").write_text("a b\n")
    (data / "train.b").write_text("b a\n")
    assert cli([*common, "--data", str(data), "--output_dir", str(occupied), "--engine", "torch"]) == 2
    assert "holds files that attn distill did not write" in capsys.readouterr().err
    assert (occupied / "notes.txt").read_text() == "mine\n"
