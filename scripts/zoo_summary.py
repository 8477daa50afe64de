"""What a zoo run showed, one block per deployed model: verdict, failures, warnings, whether every sentence of
its sign-off holds (tests/claims.py), whether every export is of the reference's weights, and its speed table.

    python scripts/zoo_summary.py STORE_ROOT [STORE_ROOT ...]

Each STORE_ROOT holds <name>/vNNNN folders; the newest version of each name is summarized. Exit 1 when any
model did not sign off, failed a variant, or has a report claim that does not hold. Never imported by pipeline/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.speed_table import table  # noqa: E402
from tests.claims import problems  # noqa: E402


def newest(store: Path) -> list[Path]:
    return [
        sorted(name.glob("v[0-9]*"))[-1] for name in sorted(store.iterdir()) if list(name.glob("v[0-9]*"))
    ]


def summary(version: Path) -> tuple[bool, str]:
    manifest = json.loads((version / "manifest.json").read_text())
    reports = version / "reports"
    accuracy = json.loads((reports / "accuracy.json").read_text())
    speed = json.loads((reports / "speed.json").read_text())
    digests = {a["details"].get("weights") for a in manifest["artifacts"] if a["details"].get("weights")}
    claims = problems(version)
    failed = manifest.get("failed") or []
    lines = [f"## {manifest['name']} {manifest['version']}: {manifest['headline']}"]
    lines += [f"- FAILED {f['artifact']} at {f['stage']}: {f['error'][:300]}" for f in failed]
    lines += [f"- warning: {w[:300]}" for w in manifest.get("warnings") or []]
    lines.append(f"- exports of one set of weights: {len(digests) <= 1} ({len(digests)} digest(s))")
    lines += [f"- CLAIM DOES NOT HOLD: {c}" for c in claims] or ["- every report claim holds"]
    winner = version / "winner.json"
    if winner.exists():
        w = json.loads(winner.read_text())
        lines.append(
            f"- winner {w['artifact']} on {w['runtime']} ({w['io']} I/O): {w['value']:.4g} {w['unit']}"
        )
    lines += ["", table(speed, accuracy), ""]
    ok = manifest["signed_off"] and not failed and not claims and len(digests) <= 1
    return ok, "\n".join(lines)


def main(argv: list[str]) -> int:
    ok = True
    for store in argv:
        for version in newest(Path(store)):
            good, text = summary(version)
            ok &= good
            print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
