"""The repository never carries a virtual environment.

A worktree's ``.venv`` is often a symlink to a shared environment; ``.venv/`` in ``.gitignore``
matches only a folder, so such a link was once committed, and merging it replaced the main
checkout's environment by a link to itself (git overwrites ignored files).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gitignore_ignores_venv_as_a_folder_or_a_link():
    lines = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert ".venv" in lines


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_no_virtual_environment_is_tracked():
    tracked = subprocess.run(["git", "ls-files", "--", ".venv", "*/.venv"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    assert tracked == ""
