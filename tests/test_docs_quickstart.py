"""README Quick start works where system pip is locked, and CI runs exactly it (issue 6 item 18)."""

from __future__ import annotations

import re
import shlex
import subprocess

from tests.helpers import ROOT


def _quickstart_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quick start\s+```sh\n(.*?)```", readme, re.S)
    assert block, "README has no Quick start sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_second_quickstart_command_installs_into_a_venv_not_the_system():
    install = _quickstart_lines()[1]
    commands = [shlex.split(part) for part in install.split("&&")]
    assert commands[0][:3] == ["python3", "-m", "venv"], install
    venv = commands[0][3]
    for argv in commands[1:]:
        # every later command runs the venv's own interpreter or pip: PEP 668 does not apply there
        assert argv[0].startswith(f"{venv}/bin/"), f"{argv[0]} runs outside the venv: {install}"
    assert any(argv[-2:] == ["-m", "pytest"] or argv[-1] == "pytest" for argv in commands), install
    assert subprocess.run(["bash", "-n", "-c", install]).returncode == 0


def test_ci_runs_exactly_the_readme_command():
    """CI may prepare its environment first (CI=1, the TypeScript client), then runs the README line as is."""
    install = _quickstart_lines()[1]
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands[-1] == install, commands[-1]
    assert not any("pip install" in line or "pytest" in line for line in commands[:-1]), commands


def test_readme_says_where_state_lives_and_how_to_move_it():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "AKM_DATA_DIR" in readme and "~/.local/share/akm" in readme
    assert "conftest" in readme  # how the tests keep away from the user's journal


def test_readme_engine_config_commands_run_as_written(capsys, monkeypatch):
    """Every `akm config` line of README "Run steps with a model or an agent" works, in order."""
    from akm import cli

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Run steps with a model or an agent.*?```sh\n(.*?)```", readme, re.S)
    assert block, "README has no engine config sh block"
    monkeypatch.setenv("OPENAI_KEY", "sk-readme-test-key")
    ran = 0
    for line in block.group(1).splitlines():
        argv = shlex.split(line, comments=True)
        if not argv or argv[0] != "akm":
            continue
        code = cli.main(argv[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"{line}\n{err}"
        ran += 1
    assert ran >= 5
    assert cli.main(["config", "get", "engines.cloud.apiKey"]) == 0
    assert "${OPENAI_KEY}" in capsys.readouterr().out


def test_readme_install_puts_akm_on_the_path(akm_bin, shiv_root, tmp_path):
    """README "Install": after its lines, `akm` (not `dist/akm`) answers — the step newcomers missed
    (`akm: command not found`). Run as written, with HOME a temporary directory."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Install\s+```sh\n(.*?)```", readme, re.S)
    assert block, "README has no Install sh block"
    lines = [line for line in block.group(1).splitlines() if shlex.split(line, comments=True)]
    assert shlex.split(lines[0], comments=True) == ["./build.sh"], lines
    assert shlex.split(lines[-1], comments=True) == ["akm", "--version"], lines
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "akm").symlink_to(akm_bin)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "AKM_CACHE_DIR": str(shiv_root)}
    for line in lines[1:-1]:  # the build is the fixture's; then every line as a shell runs it
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, (line, proc.stderr)
    env["PATH"] = f"{home}/.local/bin:{env['PATH']}"  # what the README says to add
    assert "~/.local/bin" in readme and 'export PATH="$HOME/.local/bin:$PATH"' in readme
    proc = subprocess.run(["akm", "--version"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("akm "), proc.stderr
