"""The old import path of the argument types and checks, kept for callers: they live in
:mod:`ragpic.cmdline` (shared with ``python -m ragpic.demo``, which must not import the CLI),
and :class:`UsageError` in :mod:`ragpic.errors`. ragpic's own modules import from those."""

from ragpic.cmdline import (Parser, at_least, check_model, check_output, csv_of, device_name, fraction,
                            method_list, method_name, need_file, need_folder, need_module)
from ragpic.errors import UsageError

__all__ = ["UsageError", "Parser", "at_least", "csv_of", "fraction", "method_name", "method_list",
           "device_name", "need_module", "need_folder", "need_file", "check_model", "check_output"]
