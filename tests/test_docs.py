"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, its Python snippets run,
the environment-variable page is current and complete, and the README, the docs and CI agree on
the commands.

Snippets: every fenced ```python block of the README and of each page under docs/ runs, in page order, in one namespace
per page, in a scratch directory. A block that cannot run here (it needs a cluster, a GPU, a long
compile) is preceded by the line ``<!-- test: skip REASON -->``, which the rendered page hides.
"""
import ast
import contextlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from openpop import env_vars

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SKIP_MARK = re.compile(r"<!--\s*test:\s*skip\s+(?P<reason>.+?)\s*-->")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.M | re.S)
BUILD_BUDGET_S = 60  # the build takes ~10 s on the project's 2-core machine


# --------------------------------------------------------------------------- snippets
def code_blocks(page: Path):
    """(line, language, code, skip reason or None) of every fenced block of ``page``."""
    text = page.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        marker = SKIP_MARK.search(before[-1]) if before else None
        line = text.count("\n", 0, match.start()) + 1
        code = textwrap.dedent(match.group("body")) if match.group("indent") else match.group("body")
        yield line, match.group("lang"), code, marker.group("reason") if marker else None


def markdown_files():
    """The README and every page under docs/."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def pages_with_snippets():
    for page in markdown_files():
        if any(lang in ("python", "py") and reason is None for _, lang, _, reason in code_blocks(page)):
            yield page.relative_to(ROOT).as_posix()


@contextlib.contextmanager
def scratch_environment(directory: Path):
    """The snippets run in ``directory``; the environment and working directory are put back."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@pytest.mark.parametrize("page", list(pages_with_snippets()))
def test_the_python_snippets_of_a_page_run(page, tmp_path):
    namespace = {"__name__": "__docs__"}
    ran = 0
    with scratch_environment(tmp_path):
        for line, lang, code, reason in code_blocks(ROOT / page):
            if lang not in ("python", "py") or reason is not None:
                continue
            exec(compile(code, f"{page}, the block at line {line}", "exec"), namespace)
            ran += 1
    assert ran


def test_every_skipped_snippet_gives_a_reason():
    for page in markdown_files():
        for marker in re.finditer(r"<!--\s*test:.*?-->", page.read_text(encoding="utf-8")):
            assert SKIP_MARK.fullmatch(marker.group(0)), f"{page}: {marker.group(0)!r}: write <!-- test: skip WHY -->"


# --------------------------------------------------------------------------- the site
def _docs_toolchain_missing() -> bool:
    return any(importlib.util.find_spec(name) is None
               for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"))


@pytest.mark.slow
@pytest.mark.skipif(_docs_toolchain_missing(), reason="MkDocs, Material or mkdocstrings not installed (extra: docs)")
def test_the_site_builds_in_strict_mode(tmp_path):
    start = time.monotonic()
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # (Material's banner about MkDocs 2.0; mkdocs is pinned < 1.7)
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    seconds = time.monotonic() - start
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    assert seconds < BUILD_BUDGET_S, f"the docs build took {seconds:.0f} s (budget {BUILD_BUDGET_S} s)"
    site = tmp_path / "site"
    for page in ("index.html", "reference/environment-variables/index.html", "reference/api/options/index.html"):
        assert (site / page).is_file(), page
    # The API reference is generated from the docstrings.
    options_page = (site / "reference/api/options/index.html").read_text(encoding="utf-8")
    assert "deviceIterations" in options_page and "gradientAccumulation" in options_page


# --------------------------------------------------------------------------- environment variables
def test_the_environment_variable_page_is_current():
    page = ROOT / env_vars.PAGE
    assert page.read_text(encoding="utf-8") == env_vars.markdown(), (
        "docs/reference/environment-variables.md is out of date: run python -m openpop.env_vars --write")


def openpop_variables_in_source() -> dict:
    """Every ``OPENPOP_*`` name in a string of src/ (code and docstrings) -> the files naming it."""
    found = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in re.findall(r"\bOPENPOP_[A-Z][A-Z0-9_]*[A-Z0-9]\b", node.value):
                    found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_every_openpop_variable_in_the_source_is_in_the_registry():
    found = openpop_variables_in_source()
    missing = {name: sorted(paths) for name, paths in found.items() if name not in env_vars.BY_NAME}
    assert not missing, f"add these to src/openpop/env_vars.py (then python -m openpop.env_vars --write): {missing}"
    assert len(found) >= 18


def test_every_registered_openpop_variable_is_read_somewhere():
    found = openpop_variables_in_source()
    stale = [name for name in env_vars.BY_NAME if name.startswith("OPENPOP_") and name not in found]
    assert not stale, f"registered in env_vars.py but named nowhere in src/: {stale}"


def test_the_registry_has_no_duplicates_and_every_entry_is_described():
    names = [variable.name for variable in env_vars.VARIABLES]
    assert len(names) == len(set(names))
    for variable in env_vars.VARIABLES:
        assert variable.default and variable.meaning and variable.group in env_vars.GROUP_TITLES, variable.name
        if variable.see:
            assert (DOCS / variable.see.split("#")[0]).is_file(), (variable.name, variable.see)


def test_the_env_vars_command_checks_the_page(tmp_path, capsys):
    stale = tmp_path / "page.md"
    stale.write_text("old", encoding="utf-8")
    assert env_vars.main(["--check", "--page", str(stale)]) == 1
    assert env_vars.main(["--write", "--page", str(stale)]) == 0
    assert env_vars.main(["--check", "--page", str(stale)]) == 0


# --------------------------------------------------------------------------- commands
def two_commands(path: Path) -> list:
    """The command lines of the first bash block of ``path`` that installs and runs the main job and the
    suite."""
    for _, lang, code, _ in code_blocks(path):
        if lang == "bash" and "openpop-bert" in code and "pytest" in code:
            return [line.strip() for line in code.splitlines() if line.strip() and not line.startswith("#")]
    raise AssertionError(f"{path}: no bash block with pip install")


def test_the_readme_and_the_install_page_give_the_same_two_commands():
    readme = two_commands(ROOT / "README.md")
    assert readme == two_commands(DOCS / "install.md")
    assert len(readme) == 2
    assert all("torch==2.13.0" in line for line in readme)
    assert "openpop-bert" in readme[0] and "pytest" in readme[1]


def test_ci_runs_the_readme_test_command():
    test_command = two_commands(ROOT / "README.md")[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines, f".ci/run must run the README's test command: {test_command}"
    assert shlex.split(test_command)[:2] == ["pip", "install"]


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 200
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / page).is_file(), page


def test_the_first_screen_of_the_docs_index_covers_what_new_users_look_for():
    first_screen = "\n".join((DOCS / "index.md").read_text(encoding="utf-8").splitlines()[:20])
    for needle in ("Install", "Run my PopTorch script", "poprun", "IPUJob", "Profile"):
        assert needle in first_screen, needle
