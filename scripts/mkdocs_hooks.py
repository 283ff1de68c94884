"""MkDocs hooks of the documentation site (mkdocs.yml: ``hooks``).

* Pages added under ``docs/guides/`` without an entry in ``nav`` are appended to the "Guides"
  section, titled by their first heading, so a new guide shows up without editing mkdocs.yml.
"""
import pathlib
import re

GUIDES_SECTION = "Guides"


def _listed(entries) -> set:
    found = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found |= _listed(value)
        else:
            found.add(value)
    return found


def _title(path: pathlib.Path) -> str:
    match = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), re.M)
    return match.group(1).strip() if match else path.stem.replace("-", " ").capitalize()


def on_config(config, **kwargs):
    nav = config.get("nav") or []
    section = next((entry[GUIDES_SECTION] for entry in nav
                    if isinstance(entry, dict) and GUIDES_SECTION in entry), None)
    if section is None:
        return config
    docs = pathlib.Path(config["docs_dir"])
    listed = _listed(nav)
    for path in sorted((docs / "guides").glob("*.md")):
        relative = path.relative_to(docs).as_posix()
        if relative not in listed:
            section.append({_title(path): relative})
    return config
