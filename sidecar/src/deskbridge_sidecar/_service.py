"""``deskbridge-sidecar install-service`` / ``uninstall-service``: start at login.

Linux: a systemd **user** unit, ``~/.config/systemd/user/deskbridge-sidecar.service``
(``systemctl --user enable --now deskbridge-sidecar`` starts it; ``loginctl enable-linger``
keeps it running without a login session). macOS: a launchd agent,
``~/Library/LaunchAgents/dev.deskbridge.sidecar.plist`` (``launchctl bootstrap gui/$UID``).
Both run ``deskbridge-sidecar run --config CONFIG --log-file LOG`` with this Python's
absolute path and restart it when it fails, but not when it stopped for good — token
refused, usage error, ledger unusable (exit status 2), superseded by a newer sidecar of
the same user (3): a restart loop would not fix those (two sidecars of one user would take
it from each other in turn), and ``status`` shows the last error.

systemd says so per exit status (``RestartPreventExitStatus=2 3``). launchd cannot: its
``KeepAlive`` restarts on any non-zero exit (``SuccessfulExit: false``) or never, with no
rule per status. So the agent runs ``run --launchd``, which exits 0 instead of 2 or 3
(one line on stderr names the status it stands for); a crash (an uncaught error, exit 1;
or a signal) still exits non-zero and is restarted after ``ThrottleInterval``.

What is written is printed, with the commands that enable it; nothing is enabled behind
the user's back unless ``--now`` is given.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path

UNIT_NAME = "deskbridge-sidecar.service"
AGENT_LABEL = "dev.deskbridge.sidecar"


def executable() -> str:
    """The absolute path of this installation's ``deskbridge-sidecar`` script."""
    candidate = Path(sys.executable).parent / "deskbridge-sidecar"
    return str(candidate if candidate.exists() else Path(sys.argv[0]).resolve())


def systemd_unit(config: Path, log_file: Path | None) -> str:
    argv = [executable(), "run", "--config", str(config)]
    if log_file is not None:
        argv += ["--log-file", str(log_file)]
    lines = [
        "[Unit]",
        "Description=deskbridge sidecar (runs tools on this machine for a cloud agent)",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(shlex.quote(a) for a in argv)}",
        "Restart=on-failure",
        "RestartSec=5",
        "# 2: token refused or a usage error; 3: superseded by a newer sidecar of this user.",
        "# Restarting would not help either.",
        "RestartPreventExitStatus=2 3",
        "# SIGTERM lets a running tool finish within the grace, then exits 0",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def launchd_plist(config: Path, log_file: Path) -> bytes:
    body = {
        "Label": AGENT_LABEL,
        "ProgramArguments": [
            executable(),
            "run",
            "--config",
            str(config),
            "--log-file",
            str(log_file),
            "--launchd",  # exit 0, not 2 or 3, when a restart would not help
        ],
        "RunAtLoad": True,
        # Restarted after a non-zero exit (a crash) only; "stop for good" exits 0 (above).
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 5,
        # SIGTERM lets a running tool finish within the grace (20 s), as TimeoutStopSec=30
        "ExitTimeOut": 30,
        "StandardOutPath": str(log_file),
        "StandardErrorPath": str(log_file),
        "ProcessType": "Interactive",
    }
    return plistlib.dumps(body)


def unit_path(platform: str = sys.platform) -> Path:
    home = Path.home()
    if platform == "darwin":
        return home / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"
    base = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return base / "systemd" / "user" / UNIT_NAME


def install(
    config: Path, log_file: Path, *, now: bool = False, platform: str = sys.platform
) -> tuple[Path, str, list[list[str]]]:
    """Write the unit (or agent) file.

    Returns:
        (path written, its text, the commands that enable and start it).

    Raises:
        OSError: the file cannot be written.
        subprocess.CalledProcessError: ``now`` and an enabling command failed.
    """
    path = unit_path(platform)
    path.parent.mkdir(parents=True, exist_ok=True)
    if platform == "darwin":
        data = launchd_plist(config, log_file)
        text = data.decode()
        commands = [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(path)]]
    else:
        text = systemd_unit(config, log_file)
        data = text.encode()
        commands = [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", "--now", UNIT_NAME.removesuffix(".service")],
        ]
    path.write_bytes(data)
    if now:
        for command in commands:
            subprocess.run(command, check=True)
    return path, text, commands


def uninstall(*, platform: str = sys.platform) -> tuple[Path, bool, list[list[str]]]:
    """Remove the unit (or agent) file.

    Returns:
        (its path, whether it existed, the commands that stop and forget it; run them first
        if it is running).
    """
    path = unit_path(platform)
    if platform == "darwin":
        commands = [["launchctl", "bootout", f"gui/{os.getuid()}/{AGENT_LABEL}"]]
    else:
        commands = [
            ["systemctl", "--user", "disable", "--now", UNIT_NAME.removesuffix(".service")],
            ["systemctl", "--user", "daemon-reload"],
        ]
    existed = path.exists()
    path.unlink(missing_ok=True)
    return path, existed, commands
