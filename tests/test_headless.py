"""Headless mode stays free of the TUI's dependencies."""

from __future__ import annotations

import subprocess
import sys


def test_headless_never_imports_textual():
    code = ("import sys; from swarmling.app import cli, headless; from swarmling.app.node import loop, runner; "
            "sys.exit(1 if any(m.startswith('textual') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
