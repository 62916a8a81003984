"""pytest hooks shared by the test suite."""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Each test run keeps the `datasets` cache (the Arrow files of training data, tokenized splits and BPE vocabularies
# of training/prepare.py) in a folder of its own, set before `datasets` is imported and inherited by the training
# processes the tests start: runs neither leave files in ~/.cache nor reuse an earlier run's.
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="attn-tests-datasets-")
atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)
# The record of lone output files attn wrote (modeling_attn.api.outputs.written_files_record) goes to a state folder
# of this run, not the user's ~/.local/state.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="attn-tests-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True)

# Modules that are marked slow as a whole and are expensive merely to import.
SLOW_MODULES = {"test_transformers_common.py", "test_transformers_common_rnn.py"}


def _selects_slow_tests(config) -> bool:
    """Whether the `-m` expression of this run can select a test whose one mark is `slow`."""
    markexpr = config.getoption("markexpr", "")
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression  # the evaluator behind `-m`; private, hence the fallback
    except ImportError:
        return True
    try:
        return Expression.compile(markexpr).evaluate(lambda name, /, **kwargs: name == "slow")
    except Exception:  # an expression this matcher cannot answer: let pytest collect and decide
        return True


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """Skip importing the SLOW_MODULES (transformers' common tests) in runs that deselect slow tests (the
    default `pytest`): importing one downloads the transformers sdist on first use and imports transformers'
    test mixins."""
    if collection_path.name in SLOW_MODULES and not _selects_slow_tests(config):
        return True
    return None


def pytest_addoption(parser):
    parser.addoption(
        "--record",
        metavar="STEM",
        help="write this run's outcome (tests passed, failed, skipped; exit status) with the bench envelope "
        "(command, machine, versions) to STEM.json and STEM.md (.ci/run's oldest-transformers compat step)",
    )


def pytest_unconfigure(config):
    cache = os.environ.pop("ATTN_CACHE", None)
    if cache and Path(cache).name.startswith("attn-test-cache-"):
        shutil.rmtree(cache, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    """With `--record STEM`: the run as a record of the bench suite (bench.harness's envelope and writer)."""
    stem = session.config.getoption("--record")
    if not stem:
        return
    from bench import harness

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    outcomes = {key: len(reporter.stats.get(key, [])) for key in ("passed", "failed", "skipped", "error")}
    command = shlex.join(["python", "-m", "pytest", *session.config.invocation_params.args])
    record = harness.head(Path(stem).name, command) | {"exit_status": int(exitstatus), "tests": outcomes}
    counts = ", ".join(f"{count} {key}" for key, count in outcomes.items())
    harness.write_results(stem, record, f"Exit status {int(exitstatus)}: {counts}.\n", quiet=True)


def pytest_configure(config):
    # attn's export cache (modeling_attn.api.export_cache): the tests' exports go to a folder of this run, never into
    # the user's cache; subprocesses (`attn` commands) inherit it.
    os.environ["ATTN_CACHE"] = tempfile.mkdtemp(prefix="attn-test-cache-")
    # Marks that transformers' test_modeling_common.py uses (declared in transformers' own conftest.py).
    for mark in (
        "accelerate_tests",
        "flash_attn_test",
        "flash_attn_3_test",
        "flash_attn_4_test",
        "torch_compile_test",
    ):
        config.addinivalue_line("markers", f"{mark}: mark of transformers' common model tests")


@pytest.fixture(autouse=True)
def fresh_torch_compile_caches():
    """Each test starts with torch.compile's caches empty. Dynamo keys its compiled graphs by code object, and every
    model's forward runs through the same transformers wrapper: compiled models from earlier tests in the process
    would otherwise count towards torch's recompile limit (8) and fail a `fullgraph=True` compile that passes alone."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    yield


@pytest.fixture(scope="module")
def reverser_dir(tmp_path_factory):
    """The letter reverser of `test_engines.save_reverser` (trained, 5 s), saved as a model folder once per module:
    the model of the engine, steering, document, markup and streaming tests."""
    from tasks import one_thread
    from test_engines import save_reverser

    with one_thread():
        return save_reverser(tmp_path_factory.mktemp("reverser"))


@pytest.fixture(scope="module")
def torch_engine(reverser_dir):
    """`reverser_dir` on the torch engine."""
    from modeling_attn.api.engines import load_translator

    return load_translator(str(reverser_dir), engine="torch", device="cpu")
