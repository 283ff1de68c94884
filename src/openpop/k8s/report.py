"""What a conversion did with each input field that did not go over unchanged.

Every line goes to stderr, in the order the converter met the fields (which is the
order of the input manifest and of a fixed walk, so two runs print the same lines).
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReportLine:
    kind: str  # "warning" (removed for security), "dropped" (no counterpart), "mapped"
    path: str
    message: str

    def __str__(self):
        return f"openpop-k8s: {self.kind}: {self.path}: {self.message}"


@dataclass
class ConversionReport:
    lines: list = field(default_factory=list)

    def add(self, line):
        """Record ``line`` once (several jobs from one IPUJob report the same field once)."""
        if line not in self.lines:
            self.lines.append(line)

    def warning(self, path, message):
        self.add(ReportLine("warning", path, message))

    def dropped(self, path, message):
        self.add(ReportLine("dropped", path, message))

    def mapped(self, path, message):
        self.add(ReportLine("mapped", path, message))

    def of_kind(self, kind):
        return [line for line in self.lines if line.kind == kind]

    def write(self, stream):
        for line in self.lines:
            print(line, file=stream)
