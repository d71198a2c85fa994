"""How every command-line tool ends: a result, or one `error: ...` line and a non-zero exit.

    sys.exit(run_cli(main, "trtllm-build"))

The project's own errors (`TrtLlmError`) and the errors of files a user named (missing,
unreadable, not JSON, not safetensors) become one line on stderr and exit code 2. Anything
else is a bug in this project and keeps its traceback (exit 1). `--debug` on the command line
or `TRTLLM_DEBUG=1` in the environment shows the traceback of user errors too.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Callable, Optional, Sequence

from .errors import TrtLlmError

USER_ERROR_EXIT = 2

try:  # safetensors' own error class for a file that is not (or no longer) a safetensors file
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # older safetensors
    _SafetensorError = TrtLlmError


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors that mean 'your input is bad', not 'this program is broken'."""
    return (TrtLlmError, OSError, json.JSONDecodeError, UnicodeDecodeError, _SafetensorError)


def debug_requested(argv: Optional[Sequence[str]] = None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get("TRTLLM_DEBUG", "") not in ("", "0")


def one_line(error: BaseException) -> str:
    """The error as one line: its message with newlines folded, or its type when it has none."""
    text = " ".join(str(error).split())
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.strerror}: {error.filename}"
    elif isinstance(error, json.JSONDecodeError):
        text = f"not valid JSON ({text})"
    elif isinstance(error, _SafetensorError) and not isinstance(error, TrtLlmError):
        text = f"not a readable safetensors file ({text})"
    return text or type(error).__name__


def run_cli(main: Callable[..., int], prog: str, argv: Optional[Sequence[str]] = None) -> int:
    """Runs `main(argv)`; a user error becomes `prog: error: ...` on stderr and exit code 2."""
    try:
        code = main(argv) if argv is not None else main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except user_error_types() as e:
        if debug_requested(argv):
            raise
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return USER_ERROR_EXIT
    return 0 if code is None else code


DEBUG_HELP = "show the traceback of an error instead of one line (also TRTLLM_DEBUG=1)"


def add_debug_argument(parser) -> None:
    """`--debug` (read by run_cli; the parser only has to accept it), with its help line."""
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
