"""An artifact as its consumers see it: what stages hand on, what validation and the benchmark run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ArtifactRecord:
    """Where an artifact lies in this run's folder, and what it is (kind: torchscript | onnx | engine |
    exported | aoti | report; details: what the stage that made it recorded, e.g. an engine's compute
    capabilities)."""

    name: str
    path: Path
    kind: str
    precision: str | None
    sha256: str
    stage: str
    details: dict[str, Any] = field(default_factory=dict)
    value: Any = None  # a report handed on in memory (pipeline/check/results.py); None for artifacts

    def report(self) -> Any:
        """The report this record stands for: in memory when its stage ran in this deploy, else its file."""
        from pipeline.core.files import read_report

        return self.value if self.value is not None else read_report(self.path)
