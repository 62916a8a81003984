"""Screenshots of the explainer page (docs/explain-*.png), taken in headless Chromium (tests/browser.py).

    python tests/explain_screenshots.py --model outputs/dates --model outputs/dates-rnn \
        --sentence "Tuesday, March 3rd, 1987" --step 6 --output docs

writes the page of the models (one or two) on the sentence into a temporary folder, opens it from file://, checks that
the console shows no error and that nothing but the page was requested, selects the decoding step and takes one PNG per
view: OUTPUT/explain-<view>.png (translation, beam, cross, self, head, compare) and, when the second model is an RNN,
its alignment step as OUTPUT/explain-rnn.png. docs/explain.md says how the models of the docs' pictures were trained.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser.py

from browser import chromium, console_errors, missing, requests, screenshot_views  # noqa: E402

from modeling_attn.api.explain import write_explainer  # noqa: E402


def take(models: list[str], sentence: str, output: Path, step: int, prefix: str = "explain") -> list[Path]:
    """The page of `models` on `sentence`, shot view by view into `output` (see the module docstring)."""
    from selenium.webdriver.support.ui import Select

    with tempfile.TemporaryDirectory() as folder:
        page = write_explainer(models, sentence, Path(folder) / "explain.html")
        with chromium() as driver:
            driver.get(page.as_uri())
            Select(driver.find_element("id", "step-select")).select_by_value(str(step))
            # the returned translation's last node, focused: the line under the tree reads it out
            driver.execute_script(
                "document.querySelector('#beam-tree g[data-best=\"1\"][data-status=finished]').focus()"
            )
            views = ("translation", "beam", "cross", "self", "head", "compare")
            written = screenshot_views(driver, output / prefix, views)
            picker = Select(driver.find_element("id", "model-select"))
            rnn = [option.get_attribute("value") for option in picker.options if "(RNN)" in option.text]
            if rnn:
                picker.select_by_value(rnn[0])
                Select(driver.find_element("id", "step-select")).select_by_value(str(step))
                written += [
                    path.rename(output / f"{prefix}-rnn.png")
                    for path in screenshot_views(driver, output / f"{prefix}-model", ("rnn",))
                ]
            errors, urls = console_errors(driver), requests(driver)
            if errors or urls != [page.as_uri()]:
                raise RuntimeError(f"the page logged errors {errors} or requested {urls}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="model folder (give it twice for two)")
    parser.add_argument("--sentence", required=True)
    parser.add_argument("--output", type=Path, default=Path("docs"), help="folder of the PNGs (default: docs)")
    parser.add_argument("--step", type=int, default=1, help="the decoding step shown, 1 = the first (default 1)")
    args = parser.parse_args(argv)
    if (reason := missing()) is not None:
        parser.error(reason)
    for path in take(args.model, args.sentence, args.output, args.step - 1):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
