"""What openpop's command-line tools share in ``--help``: defaults shown, examples kept as written.

Standard library only: ``--help`` must answer without loading torch (tests/test_cli_imports.py).
"""
import argparse

NO_EFFECT = "(no effect on openpop: {reason})"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with ``(default: VALUE)`` where it has a default worth showing (not
    None, False or empty, and not already named in the help); description and epilog keep their
    line breaks, so examples print as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or default is None or default is False or default == ""
                or default is argparse.SUPPRESS or "%(default)" in text or "default" in text):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def examples(*lines: str) -> str:
    """An epilog: ``example:`` (or ``examples:``) then each command line, indented."""
    head = "example:" if len(lines) == 1 else "examples:"
    return "\n".join([head, *(f"  {line}" for line in lines)])
