"""`swarmling service install|uninstall|status`: run the node as a per-user service.

Linux: a systemd *user* unit in ~/.config/systemd/user/ (packaging/swarmling.service).
macOS: a launchd agent in ~/Library/LaunchAgents/ (packaging/io.swarmling.node.plist).
Both start the node headless at login (or at boot with lingering), restart it after a crash and
stop it with SIGTERM, which the node handles cleanly. Nothing here needs root.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template
from xml.sax.saxutils import escape

from ...backends.atomic import write_atomic

from ..paths import Paths
from .arguments import Invocation

UNIT = "swarmling.service"
AGENT = "io.swarmling.node.plist"


class ServiceError(RuntimeError):
    pass


def _template(name: str) -> Template:
    # packaging/ is a namespace package (see pyproject): read its files through __path__, which
    # importlib.resources cannot do for namespace packages on Python 3.11.
    import swarmling.packaging as packaging_files

    for folder in packaging_files.__path__:
        candidate = Path(folder) / name
        if candidate.is_file():
            return Template(candidate.read_text(encoding="utf-8"))
    raise ServiceError(f"the service template {name} is missing from this installation; reinstall swarmling")


def executable() -> str:
    """The `swarmling` this command runs from (pipx's shim, a venv's script)."""
    found = shutil.which("swarmling")
    argv0 = Path(sys.argv[0])
    if argv0.name == "swarmling" and argv0.exists():
        return str(argv0.resolve())
    if found:
        return str(Path(found).resolve())
    raise ServiceError("cannot find the `swarmling` command on PATH; install it with pipx first")


def render_unit(exec_path: str, home: str | None) -> str:
    home_args = f"--home {shlex.quote(home)} " if home else ""
    return _template(UNIT).substitute(exec=shlex.quote(exec_path), home_args=home_args)


def render_agent(exec_path: str, home: str | None, log_dir: Path) -> str:
    home_array = (
        f"        <string>--home</string>\n        <string>{escape(home)}</string>\n" if home else ""
    )
    return _template(AGENT).substitute(exec=escape(exec_path), home_array=home_array, log_dir=escape(str(log_dir)))


def unit_path() -> Path:
    config = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    return config / "systemd" / "user" / UNIT


def agent_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / AGENT


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _write(path: Path, text: str) -> None:
    write_atomic(path, text, fsync=False)


def install(paths: Paths, home: str | None, start: bool = True) -> str:
    exec_path = executable()
    if sys.platform == "darwin":
        path = agent_path()
        _write(path, render_agent(exec_path, home, paths.log_dir))
        if start:
            _run(["launchctl", "unload", str(path)])
            out = _run(["launchctl", "load", "-w", str(path)])
            if out.returncode != 0:
                raise ServiceError(f"wrote {path}, but launchctl could not load it: {out.stderr.strip()}")
        return f"installed {path}" + (" and started it" if start else "")
    path = unit_path()
    _write(path, render_unit(exec_path, home))
    if not start:
        return f"installed {path}; start it with: systemctl --user enable --now {UNIT}"
    out = _run(["systemctl", "--user", "daemon-reload"])
    if out.returncode == 0:
        out = _run(["systemctl", "--user", "enable", "--now", UNIT])
    if out.returncode != 0:
        raise ServiceError(
            f"wrote {path}, but systemd's user manager did not take it ({out.stderr.strip() or out.stdout.strip()}); "
            "on a machine without a login session run `loginctl enable-linger $USER` first"
        )
    return (f"installed and started {path}; logs: journalctl --user -u {UNIT} -f. To keep it running without a "
            "login (a Pi): loginctl enable-linger $USER")


def uninstall() -> str:
    if sys.platform == "darwin":
        path = agent_path()
        if path.exists():
            _run(["launchctl", "unload", "-w", str(path)])
            path.unlink()
            return f"stopped and removed {path}"
        return "no launchd agent was installed"
    path = unit_path()
    if not path.exists():
        return "no systemd user unit was installed"
    _run(["systemctl", "--user", "disable", "--now", UNIT])
    path.unlink()
    _run(["systemctl", "--user", "daemon-reload"])
    return f"stopped and removed {path}"


def status() -> str:
    if sys.platform == "darwin":
        path = agent_path()
        if not path.exists():
            return "not installed"
        out = _run(["launchctl", "list", "io.swarmling.node"])
        return f"installed at {path}; " + ("loaded" if out.returncode == 0 else "not loaded")
    path = unit_path()
    if not path.exists():
        return "not installed"
    out = _run(["systemctl", "--user", "is-active", UNIT])
    state = out.stdout.strip() or out.stderr.strip() or "unknown"
    return f"installed at {path}; {state}"


def service_command(paths: Paths, action: str, home: str | None, start: bool) -> int:
    """`swarmling service install|uninstall|status`."""
    try:
        if action == "install":
            print(install(paths, str(Path(home).resolve()) if home else None, start=start))
        elif action == "uninstall":
            print(uninstall())
        else:
            print(status())
    except ServiceError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    return 0


def service_arguments(p) -> None:
    p.add_argument("action", choices=("install", "uninstall", "status"))
    p.add_argument("--no-start", action="store_true", help="install: write the unit file only")


def service_main(c: Invocation) -> int:
    return service_command(c.paths, c.args.action, os.environ.get("SWARMLING_HOME") or c.args.home, not c.args.no_start)
