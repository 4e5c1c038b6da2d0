"""Kafka client properties as Kafka users write them: ``-X key=value`` and Java ``.properties`` files.

Why: a person who drives ``kcat`` or ``kafka-console-consumer`` already knows
``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``... Here those
names (librdkafka's and the Java client's) are mapped to the project's own
``PIPELINE_KAFKA_*`` variables, which :class:`~pipeline.settings.KafkaSettings`
reads in this process and in every process it starts (``pipeline run
--processes N``). A key we cannot honour is refused with a one-line error (and
a "did you mean"), never silently ignored: a dropped ``security.protocol``
would send a password in clear text.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import ValidationError

from pipeline.errors import ConfigError

#: Property name (librdkafka's or the Java client's) -> the KafkaSettings field it sets.
PROPERTIES: dict[str, str] = dict(
    [
        ("bootstrap.servers", "bootstrap_servers"),
        ("metadata.broker.list", "bootstrap_servers"),
        ("security.protocol", "security_protocol"),
        ("sasl.mechanism", "sasl_mechanism"),
        ("sasl.mechanisms", "sasl_mechanism"),
        ("sasl.username", "sasl_username"),
        ("sasl.password", "sasl_password"),
        ("ssl.ca.location", "ssl_cafile"),
        ("ssl.certificate.location", "ssl_certfile"),
        ("ssl.key.location", "ssl_keyfile"),
        ("client.id", "client_id"),
        ("group.instance.id", "group_instance_id"),
        ("internal.leave.group.on.close", "leave_group_on_stop"),
    ]
)
#: Known names whose value needs translating or that have no equivalent here: why, in one line.
UNSUPPORTED: dict[str, str] = {
    "ssl.truststore.location": "Java keystores are not read here: give the CA as PEM with ssl.ca.location",
    "ssl.keystore.location": "Java keystores are not read here: give ssl.certificate.location and "
    "ssl.key.location as PEM",
    "ssl.key.password": "encrypted private keys are not supported: decrypt the key to a PEM file",
}
_JAAS = "sasl.jaas.config"
_UPPER_CASE = frozenset({"security_protocol", "sasl_mechanism"})
_SECRET_FIELDS = frozenset({"sasl_password"})


def known_keys() -> list[str]:
    return sorted({*PROPERTIES, *UNSUPPORTED, _JAAS})


def parse_assignment(text: str) -> tuple[str, str]:
    """``key=value`` of one ``-X``; a missing ``=`` is a one-line error."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"-X {text!r}: expected key=value, e.g. -X security.protocol=SASL_SSL")
    return key.strip(), value.strip()


def parse_properties(text: str, source: str) -> list[tuple[str, str]]:
    """A Java ``.properties`` file: ``key=value``, ``key: value`` or ``key value``; ``#``/``!``
    comments; a trailing backslash continues a line. Escapes other than ``\\\\`` are kept."""
    pairs: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip() if not logical else raw.strip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"((?:[^\s=:\\]|\\.)+)\s*[=:\s]\s*(.*)$", logical)
        if match is None:
            key, value = logical.strip(), ""
        else:
            key, value = match.group(1), match.group(2)
        pairs.append((key.replace("\\\\", "\\"), value.strip()))
        logical = ""
    if logical:
        raise ConfigError(f"{source}: the last line ends with a continuation backslash")
    return pairs


def read_properties(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--kafka-config {path}: {exc.strerror or exc}") from None
    return parse_properties(text, str(path))


def _jaas_credentials(value: str) -> dict[str, str]:
    """``username``/``password`` of a PLAIN or SCRAM ``sasl.jaas.config`` (the Java client's form)."""
    found = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', value))
    if "username" not in found or "password" not in found:
        raise ConfigError(
            "sasl.jaas.config: expected a PlainLoginModule or ScramLoginModule with "
            'username="..." password="..."; or give sasl.username and sasl.password'
        )
    return {"sasl_username": found["username"], "sasl_password": found["password"]}


def _field_of(key: str) -> str:
    name = key.strip().lower()
    if name in PROPERTIES:
        return PROPERTIES[name]
    if name in UNSUPPORTED:
        raise ConfigError(f"Kafka property {key!r}: {UNSUPPORTED[name]}")
    close = difflib.get_close_matches(name, known_keys(), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown Kafka property {key!r}{hint}; known: {', '.join(sorted(PROPERTIES))}")


def property_fields(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """KafkaSettings field -> value for ``pairs`` (later pairs win), every key checked."""
    fields: dict[str, str] = {}
    for key, value in pairs:
        if key.strip().lower() == _JAAS:
            fields.update(_jaas_credentials(value))
            continue
        name = _field_of(key)
        fields[name] = value.upper() if name in _UPPER_CASE else value
    return fields


def kafka_environment(fields: Mapping[str, str]) -> dict[str, str]:
    """The ``PIPELINE_KAFKA_*`` variables that carry ``fields``, after checking the values
    the way KafkaSettings will (a bad ``security.protocol`` is a one-line error here)."""
    from pipeline.settings import KafkaSettings

    try:
        KafkaSettings.model_validate(dict(fields))
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        keys = [k for k, f in PROPERTIES.items() if f == name] or [name]
        shown = "(hidden)" if name in _SECRET_FIELDS else repr(fields.get(name))
        raise ConfigError(f"Kafka property {keys[0]}={shown}: {first['msg']}") from None
    return {f"PIPELINE_KAFKA_{name.upper()}": value for name, value in fields.items()}
