"""Notices and the node's log, newest at the bottom."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import RichLog

from ..view import LogLine

LEVEL_STYLES = {"info": "", "warning": "yellow", "error": "bold red"}


class LogPane(RichLog):
    def write_lines(self, lines: list[LogLine]) -> None:
        for line in lines:
            text = Text(time.strftime("%H:%M:%S ", time.localtime(line.when)), style="dim")
            text.append(line.text, style=LEVEL_STYLES.get(line.level, ""))
            self.write(text)
