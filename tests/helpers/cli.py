"""Run commands as a user runs them: ``python -m pipeline ...`` (and other binaries) in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def run(
    command: list[str], env: dict[str, str], *, timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with text stdin/stdout/stderr captured; the caller checks the exit status."""
    return subprocess.run(command, input=stdin, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline <args>`` with captured, non-terminal output; a wide terminal, so
    tables are not folded, and no colour."""
    cli_env = {**env, "COLUMNS": "200", "NO_COLOR": "1"}
    return run([sys.executable, "-m", "pipeline", *args], cli_env, timeout=timeout)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Exit 0, and no ANSI escape codes in output that does not go to a terminal."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "\x1b[" not in result.stdout + result.stderr, "ANSI escape codes in non-terminal output"
    return result


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> str:
    """Exit 1, exactly one line on stderr containing ``fragment``, no traceback; that line."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert fragment in lines[0], lines[0]
    return lines[0]
