"""Tests of the recipe as one run object (training/train.py, `TrainingRun`; issue 40): which step reads which flag.

docs/architecture.md ("The training recipe: which step reads which flag") has a table of the steps, in the order
`run` calls them, and the flags each reads. The checks here read the code with `ast` and hold it to that table:
- each step's reads of `self.recipe.<flag>` and `self.args.<flag>` (a flag: a field of `RecipeArguments` or
  `Seq2SeqTrainingArguments`) are the table's row, and no other method of the class reads a flag;
- no method uses `self.recipe` or `self.args` whole (passed on, or bound to another name, where the reads could not
  be seen), except `build_trainer_arguments`, which copies `args` into the arguments Trainer gets;
- no function of train.py takes the flags as a parameter but `run` and `TrainingRun.__init__`;
- `run` calls the steps in the table's order.
Each check also runs on planted code, to show that it can fail. Then, on real runs: the arguments Trainer gets are
built once (the paper's learning rate, Trainer's Hub pushes off), and the parsed flags are the same after a run.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import torch
from modeling_attn.training.arguments import RecipeArguments, paper_learning_rate
from modeling_attn.training.train import TrainingRun, run
from runs import tiny_on
from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainingArguments

from modeling_attn.api.presets import load_preset
from modeling_attn.cli.train import parse_args

REPO = Path(__file__).resolve().parents[1]
SOURCE = (REPO / "training" / "train.py").read_text(encoding="utf-8")
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
FLAGS = {field.name for cls in (RecipeArguments, Seq2SeqTrainingArguments) for field in dataclasses.fields(cls)}
FLAG_HOLDERS = ("recipe", "args")
# The one step that may use `self.args` whole: it builds Trainer's copy of it (`dataclasses.replace`).
READS_ARGS_WHOLE = {"build_trainer_arguments"}
TINY = tiny_on(40)


def step_table(markdown: str) -> dict[str, set[str]]:
    """The table of docs/architecture.md's recipe section: step -> the flags it reads (in the table's order)."""
    section = markdown.split("## The training recipe: which step reads which flag", 1)[1].split("\n## ", 1)[0]
    table = {}
    for line in section.splitlines():
        if match := re.match(r"\| `(\w+)` \|.*\|(.*)\|$", line):
            table[match[1]] = set(re.findall(r"`--(\w+)`", match[2]))
    return table


def _is_flag_holder(node: ast.AST) -> bool:
    """`self.recipe` or `self.args`."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in FLAG_HOLDERS
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def method_reads(source: str, class_name: str = "TrainingRun") -> tuple[dict[str, set[str]], dict[str, int]]:
    """For each method of `class_name`: the flags it reads (`self.recipe.<flag>`, `self.args.<flag>`), and how often
    it uses `self.recipe` or `self.args` whole (any use but reading an attribute, or assigning them)."""
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name)
    reads, whole = {}, {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        holders_read = set()
        reads[method.name] = set()
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and _is_flag_holder(node.value):
                holders_read.add(id(node.value))
                if node.attr in FLAGS:
                    reads[method.name].add(node.attr)
        whole[method.name] = sum(
            1
            for node in ast.walk(method)
            if _is_flag_holder(node) and isinstance(node.ctx, ast.Load) and id(node) not in holders_read
        )
    return reads, whole


def takers_of_flags(source: str) -> list[str]:
    """The functions and methods of `source` with a parameter annotated as our flags or Trainer's."""
    takers = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef):
                annotations = [ast.unparse(arg.annotation) for arg in child.args.args if arg.annotation is not None]
                if any(name in ("RecipeArguments", "Seq2SeqTrainingArguments") for name in annotations):
                    takers.append(f"{prefix}{child.name}")
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return takers


def run_order(source: str) -> list[str]:
    """The methods `run` calls on its run object, in the order of the source."""
    function = next(
        node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == "run"
    )
    calls = [
        node.func
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    ]
    return [call.attr for call in sorted(calls, key=lambda call: (call.lineno, call.col_offset))]


def mismatches(table: dict[str, set[str]], reads: dict[str, set[str]], whole: dict[str, int]) -> list[str]:
    """What the code does that the table does not say (empty: the table is true)."""
    problems = []
    for method, flags in reads.items():
        listed = table.get(method, set())
        if unlisted := sorted(flags - listed):
            problems.append(f"{method} reads {unlisted}, not in the table")
        if method in table and (unread := sorted(listed - flags)):
            problems.append(f"{method} no longer reads {unread}, listed in the table")
    problems += [f"{step}: in the table, not a method" for step in table if step not in reads]
    problems += [
        f"{method} uses the flags whole ({count} times)"
        for method, count in whole.items()
        if count and method not in READS_ARGS_WHOLE
    ]
    return problems


TABLE = step_table(ARCHITECTURE)


def test_the_table_lists_the_steps_run_calls_in_their_order():
    assert list(TABLE)[0] == "__init__"
    assert run_order(SOURCE) == list(TABLE)[1:]
    assert {"bpe_dropout", "max_tokens_per_batch"} <= TABLE["build_training_set"]


def test_each_step_reads_the_flags_the_table_lists_and_no_other():
    reads, whole = method_reads(SOURCE)
    assert mismatches(TABLE, reads, whole) == []
    assert whole["build_trainer_arguments"] > 0  # the one whole read the rule allows is real
    assert {method for method, flags in reads.items() if flags} <= set(TABLE)


def test_no_step_takes_the_flags_whole():
    assert takers_of_flags(SOURCE) == ["run", "TrainingRun.__init__"]


def readers_of(flags: set[str], root: Path = REPO) -> set[str]:
    """The files of the package that read one of `flags` off an object (`recipe.bpe_dropout`), not their own
    attribute of that name (`self.max_tokens_per_batch` of `TranslationTrainer`, which got the value)."""
    readers = set()
    for folder in ("modeling_attn", "training"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                if isinstance(node, ast.Attribute) and node.attr in flags and not own:
                    readers.add(path.relative_to(root).as_posix())
    return readers


def test_the_batching_flags_are_read_where_they_are_checked_and_used(tmp_path):
    """--max_tokens_per_batch and --bpe_dropout: checked by validate.py, used by the run's steps; everything else
    (the trainer, the samplers, BPE-dropout itself) gets the value."""
    assert readers_of({"max_tokens_per_batch", "bpe_dropout"}) == {"training/train.py", "training/validate.py"}
    for folder, source in {
        "training": "def step(recipe):\n    return recipe.bpe_dropout\n",
        "modeling_attn": "class Trainer:\n    def batches(self):\n        return self.max_tokens_per_batch\n",
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "planted.py").write_text(source)
    assert readers_of({"max_tokens_per_batch", "bpe_dropout"}, tmp_path) == {"training/planted.py"}


PLANTED = """
class TrainingRun:
    def __init__(self, recipe: RecipeArguments, training_args):
        self.recipe, self.args = recipe, training_args

    def setup(self):
        set_seed(self.args.seed, self.args.process_index)

    def load_data(self):
        recipe = self.recipe
        return recipe.data, self.args.bpe_dropout

    def tokenize(self):
        return tokenize_splits(self.recipe)


def helper(training_args: Seq2SeqTrainingArguments, value):
    return value


def run(recipe, training_args):
    training = TrainingRun(recipe, training_args)
    training.load_data()
    training.setup()
"""


def test_planted_code_is_caught():
    table = {"__init__": set(), "setup": {"seed", "do_train"}, "load_data": {"data"}, "build_model": set()}
    reads, whole = method_reads(PLANTED)
    assert reads == {"__init__": set(), "setup": {"seed"}, "load_data": {"bpe_dropout"}, "tokenize": set()}
    assert whole == {"__init__": 0, "setup": 0, "load_data": 1, "tokenize": 1}
    assert mismatches(table, reads, whole) == [
        "setup no longer reads ['do_train'], listed in the table",
        "load_data reads ['bpe_dropout'], not in the table",
        "load_data no longer reads ['data'], listed in the table",  # read through another name: not seen, refused
        "build_model: in the table, not a method",
        "load_data uses the flags whole (1 times)",
        "tokenize uses the flags whole (1 times)",
    ]
    assert takers_of_flags(PLANTED) == ["TrainingRun.__init__", "helper"]
    assert run_order(PLANTED) == ["load_data", "setup"]
    planted_doc = (
        "## The training recipe: which step reads which flag\n\n| step | builds | flags |\n| --- | --- | --- |\n"
    )
    planted_doc += (
        "| `setup` | the seed | `--seed`, `--do_train` |\n| `push` | | |\n\n## Next\n| `train` | | `--x` |\n"
    )
    assert step_table(planted_doc) == {"setup": {"seed", "do_train"}, "push": set()}


def test_the_arguments_trainer_gets_are_a_copy_built_once(tmp_path):
    """`build_trainer_arguments`: the paper's peak rate for the model's d_model (Eq. 3) and Trainer's pushes off, in
    a copy of the parsed flags; every other flag as parsed; the parsed flags unchanged."""
    common = ["--output_dir", str(tmp_path / "out"), "--data", "unused", *TINY]  # the paper's defaults: no rate
    recipe, args = parse_args([*common, "--push_to_hub", "--warmup_steps", "40"])
    parsed = args.to_dict()
    training = TrainingRun(recipe, args)
    training.model = AutoModelForSeq2SeqLM.from_config(load_preset("tiny"))
    training.build_trainer_arguments()
    built = training.trainer_args
    assert built is not args and isinstance(built, Seq2SeqTrainingArguments)
    assert built.learning_rate == paper_learning_rate(training.model.config.d_model, 40)
    assert (built.push_to_hub, args.push_to_hub, args.learning_rate) == (False, True, None)
    assert args.to_dict() == parsed
    changed = {key for key, value in built.to_dict().items() if value != parsed[key]}
    assert changed == {"learning_rate", "push_to_hub"}
    _, given = parse_args([*common, "--learning_rate", "0.0007"])
    training = TrainingRun(recipe, given)
    training.model = AutoModelForSeq2SeqLM.from_config(load_preset("tiny"))
    training.build_trainer_arguments()
    assert training.trainer_args.learning_rate == given.learning_rate == 0.0007


def test_a_run_leaves_the_parsed_flags_as_they_were_and_trainer_trains_with_its_copy(tmp_path):
    """A whole run (train, save, evaluate): the flags `parse_args` returned are the same afterwards, and Trainer
    trained with its copy, which has the paper's learning rate (saved as training_args.bin)."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    sentences = ["the cat sat on the mat", "a dog ran in the park", "1987-03-03", "the 4th of July 1776"] * 5
    (data / "train.tsv").write_text("".join(f"{sentence}\t{sentence}\n" for sentence in sentences))
    (data / "valid.tsv").write_text("the cat\tthe cat\n")
    flags = ["--data", str(data), "--output_dir", str(out), *TINY, "--eval_strategy", "no", "--do_predict", "False"]
    recipe, args = parse_args([*flags, "--average_last_n", "1", "--max_steps", "2", "--warmup_steps", "2"])
    parsed_recipe, parsed_args = dataclasses.asdict(recipe), args.to_dict()
    assert run(recipe, args) == 0
    assert (dataclasses.asdict(recipe), args.to_dict()) == (parsed_recipe, parsed_args)
    assert args.learning_rate is None and (out / "eval_results.json").is_file()
    saved = torch.load(out / "training_args.bin", weights_only=False)  # what Trainer trained with
    d_model = AutoModelForSeq2SeqLM.from_pretrained(out).config.d_model
    assert saved.learning_rate == paper_learning_rate(d_model, 2) and not saved.push_to_hub
