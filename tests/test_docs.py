"""The docs never lie: every command the README and docs/ show on the bundled data is run here and what they show
of its output is checked against what it prints; the generated pages (the CLI reference from `--help`, the tables
from core/schema.py) are current; every column table printed anywhere is a declared one; the site builds with warnings
as errors; the README stays a front door.

How a page shows a command and its output (the rules this test reads):
- a fenced block whose lines are all `pcapdecomp …` commands (a `# comment` after one is ignored) is run when it
  works on bundled data (`captures/…`, `reports/…` that an earlier command wrote, or `guide`); each must exit 0;
- the fenced block right after a block of one such command is its output: every piece of it between `…` elisions
  must appear in what the command printed, in order (spaces and line breaks aside: the terminal wraps);
- `<!-- excerpt of: COMMAND -->` on the line before a fenced block checks that block the same way against COMMAND.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from corpus import MANIFEST, captures

from pcapdecomp.core.schema import TABLES, markdown_table

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
EXCERPT = re.compile(r"^<!-- excerpt of: (.+?) -->$")


def fenced_blocks(text: str) -> list[tuple[int, list[str], str]]:
    """(index of the opening line, the block's lines, the nearest non-blank line before it) for each fenced block."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            blocks.append((i, lines[i + 1:end], before))
            i = end + 1
        else:
            i += 1
    return blocks


def commands_of(block: list[str]) -> list[str] | None:
    """The commands of a block of `pcapdecomp …` lines, comments cut; None when it is not such a block."""
    if not block or not all(line.startswith("pcapdecomp ") for line in block):
        return None
    return [line.split("  #")[0].strip() for line in block]


def runnable(command: str) -> bool:
    words = shlex.split(command)
    if words[1] == "guide":
        return True
    if words[1] == "lab":  # records with root and network namespaces: tests/test_lab.py
        return False
    return any(w.startswith(("captures/", "reports/")) for w in words[2:])


class Runner:
    """Runs each documented command once, in a folder where captures/ is the bundled one, and keeps its output."""

    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "captures").symlink_to(REPO / "captures")
        self.outputs: dict[str, str] = {}

    def output(self, command: str) -> str:
        if command not in self.outputs:
            done = subprocess.run([sys.executable, "-m", "pcapdecomp.cli", *shlex.split(command)[1:]],
                                  capture_output=True, text=True, cwd=self.folder, env=ENV)
            assert done.returncode == 0, f"{command}: exit {done.returncode}: {done.stderr[-2000:]}"
            self.outputs[command] = done.stdout
        return self.outputs[command]


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    return Runner(tmp_path_factory.mktemp("docs"))


def _flat(text: str) -> str:
    return " ".join(text.split())


def assert_shown_in(shown: list[str], printed: str, where: str) -> None:
    """Each piece of `shown` between `…` elisions appears in `printed`, in order."""
    flat, at = _flat(printed), 0
    for piece in (_flat(p) for p in "\n".join(shown).split("…")):
        if not piece:
            continue
        found = flat.find(piece, at)
        assert found >= 0, f"{where}: the docs show\n  {piece}\nbut the command printed\n  {flat[at:at + 2000]}"
        at = found + len(piece)


def documented_runs() -> list[tuple[str, int, list[str], list[str] | None]]:
    """(page, line, commands, the output shown or None) for each runnable block; pages in order, README first."""
    runs = []
    for page in PAGES:
        blocks = fenced_blocks(page.read_text(encoding="utf-8"))
        text_lines = page.read_text(encoding="utf-8").splitlines()
        for n, (start, block, before) in enumerate(blocks):
            marker = EXCERPT.match(before)
            if marker:
                runs.append((page.name, start + 1, [marker.group(1)], block))
                continue
            commands = commands_of(block)
            if not commands or not any(runnable(c) for c in commands):
                continue
            shown = None
            if n + 1 < len(blocks) and len(commands) == 1:
                next_start = blocks[n + 1][0]
                end = start + len(block) + 1
                if all(not line.strip() for line in text_lines[end + 1:next_start]) \
                        and commands_of(blocks[n + 1][1]) is None:
                    shown = blocks[n + 1][1]
            runs.append((page.name, start + 1, [c for c in commands if runnable(c)], shown))
    return runs


def test_documented_commands_print_what_the_docs_show(runner):
    runs = documented_runs()
    shown = [r for r in runs if r[3] is not None]
    # the front door's own examples are among them: the guide, an analysis, a comparison
    readme = {c.split()[1] for page, _, cmds, _ in runs if page == "README.md" for c in cmds}
    assert {"guide", "analyze", "compare"} <= readme
    assert len(shown) >= 8, runs
    for page, line, commands, output in runs:
        for command in commands:
            printed = runner.output(command)
        if output is not None:
            assert_shown_in(output, printed, f"{page}:{line}")


def test_the_verdict_table_is_what_analyze_says(bundled_analysis):
    """docs/concepts.md's table of first sentences: each is the story analyze tells on that recording (the run's
    shared `analyze captures/NAME`, tests/conftest.py; its summary.json as written)."""
    text = (REPO / "docs" / "concepts.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", text, re.M)
    assert len(rows) >= 4
    for name, sentence in rows:
        summary = json.loads((bundled_analysis(name).out_dir / "summary.json").read_text(encoding="utf-8"))
        assert summary["story"]["sentence"] == sentence, name


def test_generated_pages_are_current():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "docs.py"), "--check"], capture_output=True,
                          text=True, cwd=REPO, env=ENV)
    assert done.returncode == 0, done.stderr


def test_every_printed_column_table_is_a_declared_one():
    """A column table anywhere in the docs is exactly a declaration of core/schema.py: a copy cannot go stale."""
    declared = {markdown_table(columns) for columns in TABLES.values()}
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line == "| column | dtype | meaning |":
                end = next((j for j in range(i, len(lines)) if not lines[j].startswith("|")), len(lines))
                table = "\n".join(lines[i:end])
                assert table in declared, f"{page.name}:{i + 1}: a column table that core/schema.py does not declare"


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "capture-guide" / "index.html").exists()


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+|CHANGELOG\.md)", text):
        assert (REPO / link).exists(), link


def test_counts_the_docs_quote_are_the_tests_counts():
    """Numbers about the test suite that the docs quote, counted here rather than typed."""
    sweep = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_field*.py"))
    # the caller's PYTEST_ADDOPTS (a -k, a plugin of theirs) is not this count's
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", *sweep],
                          capture_output=True, text=True, cwd=REPO,
                          env={k: v for k, v in ENV.items() if k != "PYTEST_ADDOPTS"})
    runs = sum(1 for line in done.stdout.splitlines() if "test_analyze_runs_and_its_outputs_agree[" in line)
    bundled = len(list((REPO / "captures").glob("*/*.pcap")))
    sets = len(list((REPO / "captures").glob("*/capture.toml")))
    assert runs > 0
    development = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    analysis = _flat((REPO / "docs" / "analyze.md").read_text(encoding="utf-8"))
    assert f"the field sweep, tests/field_sweep.py, {runs} runs" in _flat(development)
    assert f"{runs} runs" in analysis and f"the {bundled} bundled pcaps" in analysis
    assert f"the {sets} capture-set folders" in analysis
    assert f"all {bundled} bundled captures" in _flat(development)
    if MANIFEST.exists():  # the public corpus, where this checkout has it
        theirs = captures()
        projects = len({row["path"].split("/")[0] for row in theirs})
        assert f"({len(theirs)} captures from {projects} projects;" in _flat(development)
        assert f"the {len(theirs)} of the public corpus" in analysis


def test_the_readme_install_gives_a_working_command(tmp_path):
    """The README's two install commands, in a fresh virtual environment (the dependencies, and pip itself, from
    this Python's own site-packages: a copy of pip installed into the environment would be most of the test's
    work; pip fetches only the build backend, as `pip install .` does): the installed copy, not the checkout,
    answers; and `lab record`, a development command, says so in one line outside a checkout and finds the lab
    from a checkout's root."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                           "--disable-pip-version-check", str(REPO)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    if done.returncode != 0 and "satisfies the requirement setuptools" in done.stderr:
        pytest.skip("pip cannot fetch the build backend (setuptools, wheel): no package index here")
    assert done.returncode == 0, done.stderr[-2000:]
    command = str(venv / "bin" / "pcapdecomp")
    done = subprocess.run([command, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "guide" in done.stdout and "analyze" in done.stdout
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import pcapdecomp; print(pcapdecomp.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    assert where.startswith(str(venv))
    done = subprocess.run([command, "lab", "record", "group-stall", "--no-install"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "development command" in done.stderr and "root of a checkout" in done.stderr
    done = subprocess.run([command, "lab", "record", "no-such-scenario", "--no-install"], capture_output=True,
                          text=True, env=env, cwd=REPO)
    assert done.returncode == 2 and "unknown scenario 'no-such-scenario'" in done.stderr, done.stderr


def test_usage_lines_name_only_options_the_command_has():
    """A usage synopsis in the docs (`pcapdecomp CMD [--opt …]…`) names options that CMD's `--help` lists; the
    reference, docs/cli.md, is generated from `--help` (and checked current above)."""
    reference = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    helps = dict(re.findall(r"^## `pcapdecomp ([a-z ]+)`\n\n```\n(.*?)\n```", reference, re.M | re.S))
    checked = 0
    for page in PAGES:
        for _, block, _ in fenced_blocks(page.read_text(encoding="utf-8")):
            if not block or not re.match(r"pcapdecomp [a-z]+ .*\[", block[0]):
                continue
            command = block[0].split()[1]
            assert command in helps, f"{page.name}: no command {command!r}"
            for option in set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(block))):
                assert re.search(rf"(?<![\w-]){option}(?![\w-])", helps[command]), \
                    f"{page.name}: `pcapdecomp {command}` has no {option}"
            checked += 1
    assert checked >= 4
