"""The errors rule (see openpop/errors.py): raise and warning sites name their message, they never
spell it.

A message is a constant from ``openpop/errors.py`` (PopTorch's API) or from its package's
``messages.py``; a raise site may fill it in (``.format``) but holds no prose of its own.
User input is checked with explicit raises, not ``assert``, so ``python -O`` changes nothing.
"""
import ast
import pathlib
import re
import subprocess
import sys

import pytest

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
MESSAGE_MODULES = ("openpop/errors.py", "messages.py")
PROSE = re.compile(r"[A-Za-z]+\s+[A-Za-z]+")  # two words: a message, not a key, a path or a separator


def covered_modules():
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if not relative.endswith(MESSAGE_MODULES):
            yield relative


def literal_prose(node):
    """The string literals and f-strings with words in them under ``node``."""
    texts, parts = [], set()
    for n in ast.walk(node):
        if isinstance(n, ast.JoinedStr):  # its literal parts, the replacement fields left out
            texts.append("".join(p.value if isinstance(p, ast.Constant) else "" for p in n.values))
            parts.update(id(p) for p in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in parts:
            texts.append(n.value)
    return [text for text in texts if PROSE.search(text)]


def is_warning(node):
    """``warnings.warn(...)``, ``logger.warning(...)``, a report's ``.warning(...)``."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("warn", "warning")


def rule_breaks(source):
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            found += [f"line {node.lineno}: raise with its own text {text!r}" for text in literal_prose(node.exc)]
        elif is_warning(node):
            found += [f"line {node.lineno}: warning with its own text {text!r}" for text in literal_prose(node)]
        elif isinstance(node, ast.Assert):
            found.append(f"line {node.lineno}: assert (python -O removes it): raise explicitly")
    return found


@pytest.mark.parametrize("module", list(covered_modules()))
def test_raise_and_warning_sites_use_message_constants(module):
    assert rule_breaks((SRC / module).read_text()) == []


def test_the_rule_catches_literals_fstrings_and_asserts():
    source = ('raise ValueError("the value is bad")\n'
              'raise ValueError(f"got {x} instead")\n'
              'raise ValueError("got %s instead" % x)\n'
              'logger.warning("this is ignored")\n'
              'assert x, M.X\n')
    assert len(rule_breaks(source)) == 5
    assert rule_breaks('raise ValueError(M.X.format(x=", ".join(names)))\nraise ManifestError("spec.x", M.Y)\n'
                       'raise\nraise exc from None\n') == []


@pytest.mark.slow
def test_checks_survive_python_dash_O():
    # The asserts on user input became raises: with -O they still raise the same AssertionError.
    program = ("import poptorch\nimport torch\n"
               "for call in (lambda: poptorch.Options().randomSeed('1'),\n"
               "             lambda: poptorch.Options().Precision.enableStochasticRounding(1),\n"
               "             lambda: poptorch.Options().outputMode(poptorch.OutputMode.EveryN),\n"
               "             lambda: poptorch.Options().Training.set(noSuchOption=1),\n"
               "             lambda: poptorch.Phase(['a']).ipus(0, 1),\n"
               "             lambda: poptorch.optim.SGD([], lr=0.1, accum_type=int),\n"
               "             lambda: poptorch.identity_loss(torch.ones(2), reduction='max'),\n"
               "             lambda: poptorch.inferenceModel(torch.nn.Linear(1, 1)).setOptimizer(None)):\n"
               "    try:\n"
               "        call()\n"
               "    except AssertionError as error:\n"
               "        print('AssertionError', error)\n"
               "    else:\n"
               "        print('no error')\n")
    result = subprocess.run([sys.executable, "-O", "-c", program], capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and all(line.startswith("AssertionError ") for line in lines), result.stdout
