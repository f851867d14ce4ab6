"""The service files: rendered with real paths and checked by the OS's own tools where present."""

from __future__ import annotations

import plistlib
import shutil
import subprocess

import pytest

from swarmling.app.commands import service


def test_systemd_unit_renders_and_verifies(tmp_path):
    exe = tmp_path / "bin" / "swarmling"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    text = service.render_unit(str(exe), "/home/v/swarm ling")
    assert f"ExecStart={exe} --home '/home/v/swarm ling' run --headless" in text
    for option in ("NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=strict", "KillSignal=SIGTERM", "Nice=19"):
        assert option in text
    assert "${" not in text
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "swarmling.service"
    unit.write_text(text)
    runtime = tmp_path / "runtime"  # verify --user wants a runtime dir; CI containers have no session
    runtime.mkdir(mode=0o700)
    out = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path)})
    # Any complaint about the unit (an unknown key, a bad value) names the file; verify still exits 0.
    problems = [line for line in out.stderr.splitlines() if "swarmling.service" in line]
    assert out.returncode == 0 and not problems, out.stderr


def test_launchd_agent_is_a_valid_plist(tmp_path):
    text = service.render_agent("/Users/v/.local/bin/swarmling", "/Users/v/a&b", tmp_path)
    plist = plistlib.loads(text.encode())
    assert plist["Label"] == "io.swarmling.node"
    assert plist["ProgramArguments"] == ["/Users/v/.local/bin/swarmling", "--home", "/Users/v/a&b", "run", "--headless"]
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["Nice"] == 19
    assert plist["StandardErrorPath"] == f"{tmp_path}/service.err"
    plain = plistlib.loads(service.render_agent("/x/swarmling", None, tmp_path).encode())
    assert plain["ProgramArguments"] == ["/x/swarmling", "run", "--headless"]
