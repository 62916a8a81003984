"""The one base class of our errors that mean "asked for something impossible": `UserError`.

Every error type of ours that a person causes by what they ask (a flag value or a combination of flags, data, a model
folder, an output path) derives from `UserError`, beside the built-in class Python code would catch
(`DataError(UserError, ValueError)`, `ModelFolderError(UserError, OSError)`). The commands report a `UserError` as
one line and exit status 2; any other exception is a bug, reported with its traceback (`modeling_attn.cli.report`).
"""

from __future__ import annotations


class UserError(Exception):
    """Something asked for that cannot be done; the message names what is wrong and where, in one line."""


class FlagError(UserError, ValueError):
    """A flag value, or a combination of flags, that cannot work; the message names the flags."""


class ExportError(UserError, ValueError):
    """A model an export format cannot represent (a model type, an activation, a vocabulary it lacks)."""


__all__ = ["ExportError", "FlagError", "UserError"]
