"""What every command's ``--help`` shows (issue 33): an example, defaults, IPU-only flags marked
"(no effect on openpop)", and no reStructuredText marks or "1 IPUs" in the texts."""
import contextlib
import io
import re

import pytest

from openpop.bert import cli as bert_cli
from openpop.distributed import messages as poprun_messages
from openpop.distributed import poprun
from openpop.k8s import cli as k8s_cli
from openpop.report import main as report_main

COMMANDS = {
    "poprun": (poprun.main, []),
    "openpop-k8s": (k8s_cli.main, []),
    "openpop-k8s convert": (k8s_cli.main, ["convert"]),
    "openpop-k8s render": (k8s_cli.main, ["render"]),
    "openpop-k8s validate": (k8s_cli.main, ["validate"]),
    "openpop-k8s run-local": (k8s_cli.main, ["run-local"]),
    "openpop-bert": (bert_cli.main, []),
    "openpop-report": (report_main, []),
}


def help_text(command):
    main, words = COMMANDS[command]
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as exit_info:
        main([*words, "--help"])
    assert exit_info.value.code == 0
    return out.getvalue()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_has_an_example_and_clean_text(command):
    text = help_text(command)
    assert text.startswith(f"usage: {command.split()[0]}")
    assert re.search(r"^examples?:(\n  | )" + re.escape(command.split()[0]) + " ", text, re.M), text
    assert "``" not in text
    assert not re.search(r"\b1 IPUs\b", text)


def test_poprun_marks_every_ipu_only_flag_and_shows_defaults():
    text = " ".join(help_text("poprun").split())  # argparse wraps lines
    for dest in poprun_messages.NO_EFFECT_REASONS:
        flag = "--" + dest.replace("_", "-")
        assert re.search(re.escape(flag) + r" [\w|]+ \(no effect on openpop: ", text), flag
    for shown in ("--num-replicas N total number of replicas (default: 1)", "(default: 29400)",
                  "(default: 300.0)", "(default: 15.0)"):
        assert shown in text


def test_openpop_bert_shows_defaults_and_marks_ipu_only_flags():
    text = " ".join(help_text("openpop-bert").split())
    assert "--gradient-accumulation GRADIENT_ACCUMULATION Micro-batches accumulated per optimizer step and " \
           "replica (default: 1)" in text
    assert "--config NAME Named configuration from configs.yml (see --list- configs) (default: demo_tiny_128)" \
        in text
    assert "IPU memory option (no effect on openpop)" in text


def test_k8s_help_shows_defaults():
    text = " ".join(help_text("openpop-k8s convert").split())
    assert "(default: pytorchjob)" in text and "(default: cpu)" in text
