"""Notices and the node's log, newest at the bottom."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.widgets import RichLog

from ..view import LogLine

LEVEL_STYLES = {"info": "", "warning": "yellow", "error": "bold red"}


class LogPane(RichLog):
    """RichLog wraps a line when it is written, at the width it has then (none while its tab is
    hidden): lines are kept and re-wrapped whenever the pane's width changes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lines: deque[LogLine] = deque(maxlen=self.max_lines or 2000)
        self._wrapped_at = 0

    def write_lines(self, lines: list[LogLine]) -> None:
        self._lines.extend(lines)
        if self.size.width:
            for line in lines:
                self.write(self._styled(line), width=self.scrollable_content_region.width)

    def on_resize(self) -> None:
        width = self.scrollable_content_region.width
        if width and width != self._wrapped_at:
            self._wrapped_at = width
            self.clear()
            for line in self._lines:
                self.write(self._styled(line), width=width)

    @staticmethod
    def _styled(line: LogLine) -> Text:
        text = Text(time.strftime("%H:%M:%S ", time.localtime(line.when)), style="dim")
        text.append(line.text, style=LEVEL_STYLES.get(line.level, ""))
        return text
