"""experiments/runs.csv is the record behind every figure the docs cite by run id.

(a) Every row has the required fields, and every command still runs under today's code: a PPO
    command's arguments load with the trainer's own loader (``training.ppo.resolve_argv`` and
    ``envs.typed_config.load_config(PPOConfig, ...)``), so a renamed or removed flag fails here;
    other entry points must exist (module or script). Rows marked ``legacy`` (a setting today's
    flags cannot state) keep their command as recorded and are not parsed.
(b) Figures tagged with a run id in README.md and docs/*.md exist in the csv. The citation format:
    a markdown table with a ``run`` column and a ``metric`` column; its ``before``, ``after``,
    ``change``, ``95% interval`` (``[lo, hi]``) and ``sd`` cells must equal the csv's ``before``,
    ``after``, ``diff``, ``lo``/``hi`` and ``sd`` to three decimals (an empty cell cites nothing).
    A run id in prose (``r58``, ``r58–r61``) must name a run of the csv.
(c) Relative links between README.md, docs/ and experiments/ resolve, anchors included.
"""
from __future__ import annotations

import csv
import importlib.util
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

from scripts.record_run import COLUMNS  # the columns the recorder writes are the ones this file checks

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "experiments" / "runs.csv"
REQUIRED = ["run_id", "machine", "command", "metric"]
VALUES = ["before", "after", "diff", "lo", "hi", "sd"]
CITING = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*CITING, *sorted((ROOT / "experiments").glob("*.md"))]
# table header -> csv column(s)
CELL_COLUMNS = {"before": ("before",), "after": ("after",), "change": ("diff",),
                "95% interval": ("lo", "hi"), "sd": ("sd",)}
RUN_ID = re.compile(r"^[a-z][a-z0-9_.-]*[a-z0-9]$")
PROSE_ID = re.compile(r"(?<![\w./-])r(\d{1,3})(?![\w.])")
NUMBER = re.compile(r"[+\-−]?\d+(?:\.\d+)?")


@lru_cache(maxsize=1)
def rows() -> list[dict[str, str]]:
    with RUNS.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == COLUMNS, f"runs.csv columns are {reader.fieldnames}, expected {COLUMNS}"
        return list(reader)


def by_run_metric() -> dict[tuple[str, str], dict[str, str]]:
    return {(r["run_id"], r["metric"]): r for r in rows()}


def test_every_row_has_its_fields_and_numbers():
    seen = set()
    for i, row in enumerate(rows(), start=2):
        where = f"runs.csv line {i} ({row['run_id']}, {row['metric']})"
        for field in REQUIRED:
            assert row[field].strip(), f"{where}: {field} is empty"
        assert RUN_ID.match(row["run_id"]), f"{where}: run id {row['run_id']!r} is not a plain id"
        assert row["date"] == "" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), f"{where}: date"
        assert row["commit"] == "" or re.fullmatch(r"[0-9a-f]{7,40}", row["commit"]), f"{where}: commit"
        assert any(row[c] for c in VALUES), f"{where}: no figure"
        for column in VALUES:
            if row[column]:
                float(row[column])  # a number, or this raises
        assert (row["run_id"], row["metric"]) not in seen, f"{where}: the same run and metric twice"
        seen.add((row["run_id"], row["metric"]))
    # one command per run: a run is one thing that was run
    commands: dict[str, set[str]] = {}
    for row in rows():
        commands.setdefault(row["run_id"], set()).add(row["command"])
    assert all(len(c) == 1 for c in commands.values()), {k: c for k, c in commands.items() if len(c) > 1}


def _ppo_args(argv: list[str]) -> list[str] | None:
    """The trainer's arguments when ``argv`` launches the PPO trainer, else None."""
    for i, arg in enumerate(argv):
        if arg in ("training/ppo.py", "training.ppo") and (arg.endswith(".py") or argv[i - 1] == "-m"):
            return argv[i + 1:]
    return None


def _check_entry_point(argv: list[str], command: str) -> None:
    if "--config_file" in argv:
        assert (ROOT / argv[argv.index("--config_file") + 1]).is_file(), command
    if "-m" in argv:
        module = argv[argv.index("-m") + 1]
        assert importlib.util.find_spec(module) is not None, f"no module {module}: {command}"
        return
    scripts = [a for a in argv if a.endswith(".py")]
    assert scripts, f"no entry point found in {command!r}"
    assert (ROOT / scripts[0]).is_file(), f"no script {scripts[0]}: {command}"


def test_every_command_parses_under_todays_code(monkeypatch):
    from envs.typed_config import load_config
    from training.config import PPOConfig
    from training.ppo import resolve_argv

    monkeypatch.chdir(ROOT)  # commands are written from the repository root
    commands = sorted({r["command"] for r in rows() if not r["legacy"]})
    assert commands
    for command in commands:
        argv = shlex.split(command)
        _check_entry_point(argv, command)
        ppo_args = _ppo_args(argv)
        if ppo_args is not None:
            cfg = load_config(PPOConfig, resolve_argv(ppo_args))
            assert isinstance(cfg, PPOConfig), command


def _tables(text: str):
    """Yield (header cells, [row cells]) for every markdown table of ``text``."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            header = [c.strip().strip("`").lower() for c in lines[i].strip().strip("|").split("|")]
            body, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                body.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            yield header, body
            i = j
        else:
            i += 1


def _numbers(cell: str) -> list[float]:
    return [float(n.replace("−", "-")) for n in NUMBER.findall(cell.replace("*", ""))]


def _cited_figures(path: Path):
    for header, body in _tables(path.read_text()):
        if "run" not in header or "metric" not in header:
            continue
        for cells in body:
            cell = dict(zip(header, cells))
            yield cell["run"].strip("` "), cell["metric"].strip("` "), cell, cells


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_figures_equal_the_csv(path):
    csv_rows = by_run_metric()
    checked = 0
    for run_id, metric, cell, cells in _cited_figures(path):
        where = f"{path.name}: row {cells}"
        assert (run_id, metric) in csv_rows, f"{where}: no ({run_id}, {metric}) in runs.csv"
        row = csv_rows[(run_id, metric)]
        for name, columns in CELL_COLUMNS.items():
            if name not in cell or not cell[name].strip():
                continue
            got = _numbers(cell[name])
            want = [row[c] for c in columns]
            assert all(want) and len(got) == len(want), f"{where}: {name} {cell[name]!r} against {want}"
            assert [round(g, 3) for g in got] == [round(float(w), 3) for w in want], \
                f"{where}: {name} is {cell[name]!r}, runs.csv says {want}"
            checked += 1
    if path.relative_to(ROOT).as_posix() in ("README.md", "docs/training.md", "docs/performance.md"):
        assert checked, f"{path.name} cites no figure by run id"


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(ROOT)))
def test_run_ids_in_prose_exist(path):
    known = {r["run_id"] for r in rows()}
    missing = {f"r{n}" for n in PROSE_ID.findall(path.read_text())} - known
    assert not missing, f"{path.name} names runs that runs.csv does not hold: {sorted(missing)}"


def _anchors(path: Path) -> set[str]:
    anchors = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


# Pages another change is adding; a link to one is accepted only while the page does not exist.
PENDING = {"docs/web_search.md", "docs/baselines.md", "docs/paper_settings.md"}


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if rel in PENDING and not dest.exists():
            continue
        assert dest.exists(), f"{path.name}: link to {target} ({rel}) does not resolve"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{path.name}: no heading #{anchor} in {rel}"
