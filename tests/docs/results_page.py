"""Read docs/RESULTS.md as claims: each ``## `` section names its command, its machine and the JSON
files under docs/results/ its tables come from, and every figure in its tables must be found in
those files, rounded as printed (used by ``test_results_page.py``; no model, no torch).

A printed figure ``x`` with ``d`` decimals is found when some number ``v`` of the named files gives
``|v * s - x| <= 0.5 * 10**-d`` for a scale ``s`` in 1, 100 (a share printed as a percentage),
1000 or 1/1000 (seconds and milliseconds); a figure printed as a ratio (``12.3x``) is also found as
the quotient of two numbers stored under the same key (a speed-up: ``full``'s time over the
method's). The table's first column names the row and is not checked; nor is prose.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "RESULTS.md"
SCALES = (1.0, 100.0, 1000.0, 0.001)
NUMBER = re.compile(r"(?<![\w.])(-?\d[\d,]*(?:\.\d+)?)(\s*(?:x|%))?(?![\w])")
JSON_LINK = re.compile(r"\]\((results/[^)\s]+\.json)\)")


@dataclass
class Claim:
    title: str
    text: str
    json_files: list[str] = field(default_factory=list)
    tables: list[list[list[str]]] = field(default_factory=list)  # rows of cells, header and rule dropped


def claims(text: str | None = None) -> list[Claim]:
    text = PAGE.read_text() if text is None else text
    out = []
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        claim = Claim(title.strip(), body, sorted(set(JSON_LINK.findall(body))))
        table: list[list[str]] = []
        for line in body.splitlines() + [""]:
            if line.startswith("|"):
                table.append([c.strip() for c in line.strip().strip("|").split("|")])
            elif table:
                claim.tables.append([row for row in table[1:] if not set("".join(row)) <= set("-: ")])
                table = []
        out.append(claim)
    return out


def numbers_in(obj) -> dict[str, list[float]]:
    """Every number in a JSON document, by the key it is stored under (list items under their list's key)."""
    found: dict[str, list[float]] = {}

    def walk(x, key):
        if isinstance(x, bool) or x is None:
            return
        if isinstance(x, (int, float)):
            found.setdefault(key, []).append(float(x))
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, str(k))
        elif isinstance(x, list):
            for v in x:
                walk(v, key)
        elif isinstance(x, str):
            m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*", x)
            if m:
                found.setdefault(key, []).append(float(m.group(1)))

    walk(obj, "")
    return found


class Numbers:
    """The numbers of some JSON files, and whether a printed figure is among them."""

    def __init__(self, paths: list[Path]):
        self.by_key: dict[str, list[float]] = {}
        for p in paths:
            for k, vs in numbers_in(json.loads(p.read_text())).items():
                self.by_key.setdefault(k, []).extend(vs)
        self.values = sorted({v for vs in self.by_key.values() for v in vs})
        self._ratios: list[float] | None = None

    def ratios(self) -> list[float]:
        if self._ratios is None:
            out = set()
            for vs in self.by_key.values():
                vs = sorted(set(vs))[:400]
                out.update(a / b for a in vs for b in vs if b != 0)
            self._ratios = sorted(out)
        return self._ratios

    def has(self, printed: str, suffix: str = "") -> bool:
        decimals = len(printed.split(".")[1]) if "." in printed else 0
        x = float(printed.replace(",", ""))
        tol = 0.5 * 10 ** -decimals + 1e-9
        if any(abs(v * s - x) <= tol for s in SCALES for v in self.values):
            return True
        if suffix.strip() == "x":
            return any(abs(r - x) <= tol for r in self.ratios())
        return False


def missing_figures(claim: Claim, root: Path = ROOT) -> list[str]:
    """The figures of ``claim``'s tables not found in its JSON files (``"row: figure"``)."""
    nums = Numbers([root / "docs" / f for f in claim.json_files])
    out = []
    for table in claim.tables:
        for row in table:
            for cell in row[1:]:
                cell = re.sub(r"`[^`]*`", "", cell)  # method names, flags: not figures
                for m in NUMBER.finditer(cell):
                    if not nums.has(m.group(1), m.group(2) or ""):
                        out.append(f"{row[0]}: {m.group(0).strip()}")
    return out
