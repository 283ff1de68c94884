"""``popart.Patterns``: graph-rewrite switches of PopART's compiler. Accepted and reported; torch
executes the ONNX ops directly, so no pattern changes results here."""
from .enums import PatternsLevel


class Patterns:
    def __init__(self, level=PatternsLevel.Default):
        if isinstance(level, (list, tuple)):
            self._enabled = dict.fromkeys(level, True)
            self.level = PatternsLevel.NoPatterns
        else:
            self.level = PatternsLevel(int(level))
            self._enabled = {}
        self.enableRuntimeAsserts = True
        self.inplaceEnabled = self.level != PatternsLevel.NoPatterns
        self.updateInplacePrioritiesForIpu = True

    def enablePattern(self, name: str, enabled: bool) -> "Patterns":
        self._enabled[name] = bool(enabled)
        return self

    def isPatternEnabled(self, name: str) -> bool:
        return self._enabled.get(name, self.level != PatternsLevel.NoPatterns)

    def enableInPlace(self, enabled: bool) -> "Patterns":
        self.inplaceEnabled = bool(enabled)
        return self

    def isInPlaceEnabled(self) -> bool:
        return self.inplaceEnabled

    @property
    def InPlace(self) -> bool:
        return self.inplaceEnabled

    @InPlace.setter
    def InPlace(self, value: bool) -> None:
        self.inplaceEnabled = bool(value)

    def __repr__(self):
        return f"Patterns(level={self.level.name}, {self._enabled})"
