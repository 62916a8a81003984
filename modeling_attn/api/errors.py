"""The one base class of our errors that mean "asked for something impossible": `UserError`.

Every error type of ours that a person causes by what they ask (a flag value or a combination of flags, data, a model
folder, an output path) derives from `UserError`, beside the built-in class Python code would catch
(`DataError(UserError, ValueError)`, `ModelFolderError(UserError, OSError)`, `WeightsError(UserError, OSError)`). The
commands report a `UserError` as one line and exit status 2; any other exception is a bug, reported with its traceback
(`modeling_attn.cli.report`). `UserError` itself is defined in the model core (`loading.py`, which travels to the Hub)
so that the core's own `WeightsError` can be one; this module is where the rest of the package imports it from.
"""

from __future__ import annotations

import importlib

from ..loading import UserError, WeightsError


class FlagError(UserError, ValueError):
    """A flag value, or a combination of flags, that cannot work; the message names the flags."""


class CommandLineError(FlagError):
    """A command line that does not parse into a request: a required flag or argument missing, one given twice, a
    combination of flags that a command's dataclass refuses (its `__post_init__`). `--help` answers these, so the
    reporter adds `(see attn COMMAND --help)` to the line, as it does for argparse's own errors."""


class ExportError(UserError, ValueError):
    """A model an export format cannot represent (a model type, an activation, a vocabulary it lacks)."""


class ExplainError(UserError, ValueError):
    """Bad input to the attention explainer (`explain.py`); the message names what is wrong."""


class ResultsError(UserError, ValueError):
    """An evaluation results file (`attn push --results`) that is not JSON or holds no score; the message names it."""


class HubUnreachableError(UserError, ConnectionError):
    """No answer from the Hugging Face Hub (no network, no such host, a timeout, HF_HUB_OFFLINE); `unreachable_hub`
    words it."""


def hub_transport_error() -> type[BaseException] | tuple[()]:
    """The error class of the HTTP client huggingface_hub reaches the Hub with (its session's package's
    `TransportError`: no connection, no name, a timeout), whichever client that is; () if it has none."""
    from huggingface_hub import get_session

    client = importlib.import_module(type(get_session()).__module__.split(".")[0])
    return getattr(client, "TransportError", ())


def unreachable_hub(error: BaseException) -> HubUnreachableError:
    """`error`, a transport error of `hub_transport_error` or huggingface_hub's `OfflineModeIsEnabled`, as the one
    line that the commands and the Python `push_to_hub` say: the Hub's address, the reason and the way out."""
    from huggingface_hub import constants
    from huggingface_hub.errors import OfflineModeIsEnabled

    reason = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if isinstance(error, OfflineModeIsEnabled):
        return HubUnreachableError(f"the Hub is switched off (HF_HUB_OFFLINE) ({reason})")
    return HubUnreachableError(
        f"the Hub ({constants.ENDPOINT}) could not be reached: {reason}; check the network or HF_ENDPOINT"
    )


__all__ = [
    "CommandLineError",
    "ExplainError",
    "ExportError",
    "FlagError",
    "HubUnreachableError",
    "ResultsError",
    "UserError",
    "WeightsError",
    "hub_transport_error",
    "unreachable_hub",
]
