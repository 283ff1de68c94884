"""A setting chosen by an environment variable from a fixed set of words (``auto`` when unset)."""
import os


def choice_from_env(env: str, choices: tuple, message: str, default: str = "auto") -> str:
    """``env``'s value, lower-cased, or ``default`` when unset or empty; a value not in
    ``choices`` raises ``ValueError`` with ``message`` (formatted with ``env`` and ``value``)."""
    raw = os.environ.get(env)
    value = (raw or "").strip().lower() or default
    if value not in choices:
        raise ValueError(message.format(env=env, value=raw))
    return value
