"""No secret literal anywhere in the repository (issue 10: "no secret literal in the repository").

A default credential in a tracked file ends up in every deployment that forgot to
override it (MinIO's well-known root default once did, in docker-compose.yaml). Every file git
tracks, or would track (untracked and not ignored), is scanned for well-known
default credentials, AWS-style access keys, private keys and a credential-named
setting given a literal value. Tests that need credentials generate throwaway
ones at run time (``secrets.token_hex``), so nothing here needs an exception.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CREDENTIAL = r"(?:password|passwd|secret|token|api_?key|access_?key|private_?key)"
# Values that name a secret rather than hold one: ${VAR}, $$VAR, <placeholder>, YAML
# aliases/anchors (*x, &x), nulls and booleans.
_NOT_A_VALUE = re.compile(r"^(?:[$<*&{]|(?:none|null|true|false|~)$)", re.IGNORECASE)

PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("a well-known default credential", re.compile("minio" + "admin|change" + "me", re.IGNORECASE)),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a private key", re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----")),
]
# `password = "abc"`, `"secret": 'abc'`, `--token="abc"`: a quoted literal after a credential name.
QUOTED = re.compile(rf"{_CREDENTIAL}[\w-]*[\"']?\s*[:=]\s*[\"']([^\"'\s]{{4,}})[\"']", re.IGNORECASE)
# YAML `password: abc`, .env `SECRET_KEY=abc`, `export TOKEN=abc`: an unquoted value, outside Python.
UNQUOTED = re.compile(
    rf"^\s*(?:export\s+|-\s+)?[\w.-]*{_CREDENTIAL}[\w.-]*\s*[:=][ \t]*([^\s\"'#][^\s#]*)", re.IGNORECASE | re.MULTILINE
)


def findings(text: str, *, python: bool) -> list[tuple[int, str]]:
    """``(line, what)`` for every secret-looking literal in ``text``."""
    found = [(m.start(), what) for what, pattern in PATTERNS for m in pattern.finditer(text)]
    for pattern in (QUOTED,) if python else (QUOTED, UNQUOTED):
        for m in pattern.finditer(text):
            if not _NOT_A_VALUE.match(m.group(1)):
                found.append((m.start(), f"a credential set to the literal {m.group(1)[:3]}…"))
    return sorted((text.count("\n", 0, start) + 1, what) for start, what in found)


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [REPO / name for name in sorted(set(listed.split("\0"))) if name and (REPO / name).is_file()]


def test_the_patterns_catch_what_they_are_for() -> None:
    """The scan would see a leak, so its silence below means something."""
    leaks = {
        "default": "MINIO_ROOT_USER: " + "minio" + "admin\n",
        "aws": "key = " + "AKIA" + "Q" * 16 + "\n",
        "pem": "-----BEGIN RSA " + "PRIVATE KEY-----\n",
        "yaml": "  sasl_password: " + "s3cr3t-value\n",
        "env": "WORKER_S3_SECRET_KEY=" + "0123456789abcdef\n",
        "python": 'client(secret_key="' + 'hard-coded")\n',
    }
    for name, text in leaks.items():
        assert findings(text, python=name == "python"), name
    allowed = (
        "MINIO_ROOT_PASSWORD: *minio-root-password\n"
        "  - &worker-secret-key ${WORKER_S3_SECRET_KEY:?not set}\n"
        'key="$$TRITON_S3_ACCESS_KEY" secret="$$TRITON_S3_SECRET_KEY"\n'
        "WORKER_S3_SECRET_KEY=\n"
        "export PIPELINE_KAFKA_SASL_PASSWORD=<from your secret store>\n"
    )
    assert findings(allowed, python=False) == []
    assert findings("secret_key=settings.secret_key.get_secret_value()\n", python=True) == []


def test_no_secret_literal_in_the_repository() -> None:
    files = _repository_files()
    assert len(files) > 100, "git did not list the repository"
    problems = []
    for path in files:
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary (ONNX graphs)
        text = data.decode("utf-8", errors="replace")
        for line, what in findings(text, python=path.suffix == ".py"):
            problems.append(f"{path.relative_to(REPO)}:{line}: {what}")
    assert problems == []


def test_the_env_file_is_ignored() -> None:
    """The `.env` a user fills from `.env.example` can never be committed by accident."""
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=REPO, check=False)
    assert ignored.returncode == 0
    kept = subprocess.run(["git", "check-ignore", "-q", ".env.example"], cwd=REPO, check=False)
    assert kept.returncode == 1
