"""Which weights an inference server may answer with: the versions a run has synced, as
data.

Every sync gives the weights a label (``RUN-vN``: the run's name and token, version N);
the server serves the last ``keep`` of them (``max_staleness`` + 1: LoRA adapters stay
loaded side by side; full weights are one version at a time). A turn fixes what it
accepts **when it is submitted**: exactly the version its episode is pinned to, or,
unpinned, any version from the oldest one then in the window on (a later sync may answer
it, never an earlier one). An answer that says another version stops the run
(:class:`~gaca_agent.generate.http.StaleWeights`); one that fits tells which version
sampled it (a step's ``policy_version``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gaca_agent.generate.http import StaleWeights


@dataclass(frozen=True)
class Expected:
    """What one submitted turn accepts: ``pinned`` (that label only) or versions from
    ``floor`` on; ``None`` for both: nothing synced yet (the base weights)."""

    pinned: str | None = None
    floor: int | None = None


class VersionWindow:
    def __init__(self, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.keep = keep
        self.versions: dict[str, int] = {}
        """Every label synced so far -> its version number."""
        self.window: list[str] = []
        """The labels the server still serves, oldest first."""

    def add(self, version: int, label: str) -> list[str]:
        """Record a synced version; the labels that fall out of the window (to unload)."""
        self.versions[label] = int(version)
        if label in self.window:
            self.window.remove(label)
        self.window.append(label)
        dropped, self.window = self.window[:-self.keep], self.window[-self.keep:]
        return dropped

    @property
    def current(self) -> str | None:
        return self.window[-1] if self.window else None

    def label_of(self, version: int) -> str:
        """The label of a version still in the window."""
        for label in self.window:
            if self.versions[label] == version:
                return label
        raise StaleWeights(f"weight version {version} is not served any more (the server "
                           f"keeps {self.window}); raise max_staleness or start the episode "
                           "on newer weights")

    def expect(self, pinned_version: int | None = None) -> Expected:
        """What a turn submitted now accepts (see the module docstring)."""
        if pinned_version is not None:
            return Expected(pinned=self.label_of(pinned_version))
        if not self.window:
            return Expected()
        return Expected(floor=min(self.versions[label] for label in self.window))

    def check(self, reported: set[str], expected: Expected, where: str) -> int | None:
        """The version that answered (the oldest one when a turn spans several), after
        checking ``reported`` labels against ``expected``; None before any sync."""
        stop = ("the server is not serving the weights this run synced; stopping rather "
                "than training on another policy's samples")
        known = {label: self.versions.get(label) for label in reported}
        if expected.pinned is not None:
            if reported != {expected.pinned}:
                raise StaleWeights(f"{where} answered with weight version {sorted(reported)}, "
                                   f"this turn was sent to {expected.pinned!r}: {stop}")
            return self.versions[expected.pinned]
        if expected.floor is None:
            return None
        bad = sorted(label for label, v in known.items() if v is None or v < expected.floor)
        if bad or not reported:
            raise StaleWeights(f"{where} answered with weight version {sorted(reported)}, "
                               f"this run accepts {self.window} (from version "
                               f"{expected.floor} on): {stop}")
        return min(v for v in known.values() if v is not None)
