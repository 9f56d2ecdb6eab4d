"""Every code block of the README and the docs runs here, so that examples cannot go
stale: Python blocks run (a page's blocks in order, in one interpreter), and each
``gaca-train``/``gaca-eval`` line of a shell block runs with ``--dry-run`` (its inputs
checked: the env builds, the data and model are found). A block, or some of its commands,
that cannot run here says so just above it, with the reason::

    <!-- not run: REASON -->                      the whole block
    <!-- not run (gaca-serve, bash): REASON -->   lines starting with these words
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
                               if not p.is_symlink())
BLOCK = re.compile(r"(?:<!-- not run(?: \((?P<only>[^)]*)\))?: (?P<why>[^>]+?) -->\n)?"
                   r"^```(?P<lang>python|bash)\n(?P<body>.*?)^```", re.M | re.S)
CLIS = {"gaca-train": "gaca_agent.cli.train", "gaca-eval": "gaca_agent.cli.eval"}


def blocks(page: str):
    """(language, body, skipped prefixes or None for the whole block, reason) of a page."""
    for m in BLOCK.finditer((ROOT / page).read_text()):
        only = [w.strip() for w in m["only"].split(",")] if m["only"] else None
        yield m["lang"], m["body"], (only if m["why"] else []), m["why"]


def commands(body: str) -> list[str]:
    """The shell block's commands: continuations joined, comments dropped."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def run_env() -> dict[str, str]:
    # a Hub model name is taken on trust here (the check refuses it only offline)
    return {**os.environ, "HF_HUB_OFFLINE": "0", "PYTHONPATH": str(ROOT)}


def pages_with(lang: str) -> list[str]:
    return [p for p in PAGES if any(b[0] == lang and b[2] is not None and
                                    (b[2] == [] or lang == "bash") for b in blocks(p))]


@pytest.mark.parametrize("page", pages_with("python"))
def test_every_python_block_runs(page, tmp_path):
    code = [body for lang, body, skip, _ in blocks(page) if lang == "python" and skip == []]
    done = subprocess.run([sys.executable, "-c", "\n".join(code)], cwd=tmp_path,
                          env=run_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("page", pages_with("bash"))
def test_every_command_runs_or_says_why_not(page, tmp_path):
    for lang, body, skip, why in blocks(page):
        if lang != "bash" or skip is None:
            continue
        for command in commands(body):
            words = shlex.split(command)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words.pop(0)  # VAR=value before the command
            if any(command.startswith(p) or " ".join(words).startswith(p) for p in skip):
                continue
            assert words[0] in CLIS, (f"{page}: `{command}` neither runs here nor is marked "
                                      "<!-- not run (...): why -->")
            args = words[1:]
            if "--dry-run" not in args and "--list-suites" not in args:
                args.append("--dry-run")
            done = subprocess.run([sys.executable, "-m", CLIS[words[0]], *args], cwd=tmp_path,
                                  env=run_env(), capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{page}: `{command}`: {done.stderr[-2000:]}"
            assert not (tmp_path / "runs").exists(), f"{command} --dry-run wrote runs/"


def test_a_marker_says_why():
    """Every marker has a reason, and every block is parsed (none silently left out)."""
    for page in PAGES:
        text = (ROOT / page).read_text()
        fences = len(re.findall(r"^```(?:python|bash)\n", text, re.M))
        assert fences == len(list(blocks(page))), page
        for _, _, skip, why in blocks(page):
            assert skip == [] or (why and len(why.split()) >= 3), (page, why)
