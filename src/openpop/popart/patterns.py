"""``popart.Patterns``: graph-rewrite switches of PopART's compiler, with PopART's pattern names,
levels, properties and errors (its table in ``names.py``). torch executes the ONNX ops directly, so
no pattern changes results here; a session still refuses, as PopART does, a set of patterns that
leaves a mandatory one off while runtime asserts are on."""
from . import messages
from .enums import PatternsLevel
from .errors import popart_exception
from .names import PRE_ALIAS_PATTERNS

# Patterns that are not pre-alias patterns: PopART switches them separately.
_SEPARATE = ("InPlace", "UpdateInplacePrioritiesForIpu")


class Patterns:
    """``Patterns()``, ``Patterns(PatternsLevel)`` or ``Patterns([names])`` (only those enabled)."""

    def __init__(self, level=PatternsLevel.Default):
        self._runtime_asserts = True
        self._settings: dict[str, bool] = {}
        self.inplaceEnabled = False
        self.updateInplacePrioritiesForIpu = False
        if isinstance(level, (list, tuple)):
            self.level = None
            for name in level:
                if name == "InPlace":
                    self.inplaceEnabled = True
                elif name == "UpdateInplacePrioritiesForIpu":
                    self.updateInplacePrioritiesForIpu = True
                elif name in PRE_ALIAS_PATTERNS:
                    self._settings[name] = True
                else:
                    hint = ", did you mean InPlace?" if name == "Inplace" else ""
                    raise popart_exception(messages.UNKNOWN_PATTERN.format(name=name, hint=hint))
            return
        self.level = PatternsLevel(int(level))
        if self.level == PatternsLevel.Default:
            self._settings = {n: default for n, (default, _) in PRE_ALIAS_PATTERNS.items()}
            self.inplaceEnabled = True
        elif self.level == PatternsLevel.All:
            self._settings = dict.fromkeys(PRE_ALIAS_PATTERNS, True)
            self.inplaceEnabled = True
        elif self.level == PatternsLevel.Minimal:
            self._settings = {n: mandatory for n, (_, mandatory) in PRE_ALIAS_PATTERNS.items()}
        self.updateInplacePrioritiesForIpu = self.level != PatternsLevel.NoPatterns

    def enablePattern(self, name: str, enabled: bool) -> "Patterns":
        if name == "InPlace":
            return self.enableInPlace(enabled)
        if name == "UpdateInplacePrioritiesForIpu":
            self.updateInplacePrioritiesForIpu = bool(enabled)
            return self
        if name not in PRE_ALIAS_PATTERNS:
            raise popart_exception(messages.UNKNOWN_PATTERN_NAME.format(name=name))
        if not enabled and PRE_ALIAS_PATTERNS[name][1]:
            raise popart_exception(messages.MANDATORY_PATTERN.format(name=name))
        self._settings[name] = bool(enabled)
        return self

    def isPatternEnabled(self, name: str) -> bool:
        if name == "InPlace":
            return self.inplaceEnabled
        if name == "UpdateInplacePrioritiesForIpu":
            return self.updateInplacePrioritiesForIpu
        if name not in PRE_ALIAS_PATTERNS:
            raise popart_exception(messages.UNKNOWN_PATTERN_NAME.format(name=name))
        return self._settings.get(name, False)

    def enableInPlace(self, enabled: bool) -> "Patterns":
        self.inplaceEnabled = bool(enabled)
        return self

    def isInPlaceEnabled(self) -> bool:
        return self.inplaceEnabled

    def enableRuntimeAsserts(self, enabled: bool) -> "Patterns":
        self._runtime_asserts = bool(enabled)
        return self

    def check_mandatory(self) -> None:
        """PopART's check as a session prepares its IR: every mandatory pattern on, unless runtime asserts
        are off."""
        if not self._runtime_asserts:
            return
        for name, (_, mandatory) in PRE_ALIAS_PATTERNS.items():
            if mandatory and not self._settings.get(name, False):
                raise popart_exception(messages.PATTERN_MUST_BE_ENABLED.format(name=name))

    def __repr__(self):
        return "".join(f"{name} " for name in sorted(self._settings))

    __str__ = __repr__


def _pattern_property(name: str, doc: str):
    def get(self) -> bool:
        return self.isPatternEnabled(name)

    def set_(self, value: bool) -> None:
        self.enablePattern(name, value)
    return property(get, set_, doc=doc)


# The patterns PopART's Python binding offers as properties (``patterns.PreUniRepl = False``).
for _prop, _name in (("PreUniRepl", "PreUniRepl"), ("PostNRepl", "PostNRepl"),
                     ("SoftMaxGradDirect", "SoftmaxGradDirect"),
                     ("NlllWithSoftMaxGradDirect", "NlllWithSoftmaxGradDirect"),
                     ("OpToIdentity", "OpToIdentity"), ("SubtractArg1GradOp", "SubtractArg1GradOp"),
                     ("MulArgGradOp", "MulArgGradOp"), ("MatMulOp", "MatMulOp"),
                     ("MatMulLhsGradOp", "MatMulLhsGradOp"), ("MatMulRhsGradOp", "MatMulRhsGradOp"),
                     ("InPlace", "InPlace")):
    setattr(Patterns, _prop, _pattern_property(_name, f"Whether PopART's {_name} pattern is on."))
