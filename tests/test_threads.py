"""The thread rule of the engines (modeling_attn.api.threads), by hand-computed values; the engines' use of it is
tested in tests/test_engines.py."""

from __future__ import annotations

import pytest
import torch

from modeling_attn.api import threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("rows", "expected"), [(1, 1), (63, 1), (64, 1), (127, 1), (128, 2), (4096, 2)])
def test_torch_threads_by_rows_at_most_torch_s_own(two_threads, rows, expected):
    assert threads.torch_threads_for(rows) == expected
    assert threads.torch_threads_for(rows, given=3) == 3  # a number given is used as it is


def test_torch_threads_restores_the_setting_also_after_an_error(two_threads):
    with threads.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), threads.torch_threads(1):
        raise RuntimeError("a failed call")
    assert torch.get_num_threads() == 2


def test_ctranslate2_and_onnxruntime_threads(two_threads):
    assert threads.ctranslate2_threads() == (1, 2)  # one thread on each of two workers
    assert threads.ctranslate2_threads(4) == (4, 1)  # the number given, on one worker
    assert [threads.split_size(count, 2) for count in (1, 2, 3, 32, 33)] == [1, 1, 2, 16, 17]
    assert (threads.onnxruntime_threads(), threads.onnxruntime_threads(3)) == (1, 3)
