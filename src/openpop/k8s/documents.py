"""Reading and writing YAML manifests (one or more documents per file).

Output is deterministic: keys are written in the order the writers build them
(``apiVersion``, ``kind``, ``metadata``, ``spec``, then Kubernetes' usual order), multi-line
strings as ``|`` blocks, and no anchors or aliases.
"""

import sys

import yaml

from openpop.k8s import messages
from openpop.k8s.errors import ManifestError


def load_documents(text, source="<input>"):
    """All non-empty YAML documents of ``text``; each must be a mapping."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            line, column = mark.line + 1, mark.column + 1
        else:  # a ReaderError (a character YAML does not allow) has a position instead
            position = getattr(exc, "position", 0)
            line, column = text.count("\n", 0, position) + 1, position - text.rfind("\n", 0, position)
        where = f" (line {line}, column {column})"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(source, messages.INVALID_YAML.format(where=where, problem=problem)) from None
    if not documents:
        raise ManifestError(source, messages.NO_YAML_DOCUMENT)
    for index, doc in enumerate(documents):
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: document {index}",
                                messages.DOCUMENT_NOT_MAPPING.format(doc_type=type(doc).__name__))
    return documents


def read_documents(path):
    if path == "-":
        binary = getattr(sys.stdin, "buffer", None)  # None: a text stream put in its place
        text = _decode(binary.read(), "<stdin>") if binary is not None else sys.stdin.read()
        return load_documents(text, "<stdin>")
    try:
        with open(path, "rb") as handle:
            content = handle.read()
    except OSError as exc:
        raise ManifestError(path, messages.FILE_UNREADABLE.format(strerror=exc.strerror)) from None
    return load_documents(_decode(content, path), path)


def _decode(content, source):
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        offset = exc.start - (content.rfind(b"\n", 0, exc.start) + 1)
        raise ManifestError(source, messages.NOT_UTF8.format(offset=offset, line=line)) from None


class _ManifestDumper(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def _represent_str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _represent_str)


def dump_documents(documents):
    return yaml.dump_all(documents, Dumper=_ManifestDumper, sort_keys=False,
                         default_flow_style=False, explicit_start=True, width=100)
