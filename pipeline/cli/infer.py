"""``pipeline infer TOPOLOGY [REQUEST]``: one request from the shell, and its outcome.

Why a command of its own when ``produce`` and ``consume`` exist: checking a
deployment by hand, or from a script, wants one call that waits for *its*
answer, not two processes racing on shared topics. It is the project's own
client (:class:`pipeline.client.SyncClient`): a private reply topic, a
``deadline`` header matching ``--timeout``, the dead letter matched by
correlation id.

Exit codes (also in docs/cli.md): 0 a result (printed as JSON on stdout), 2 a
dead letter (printed as JSON on stdout, its class and reason also on stderr),
1 an error or a timeout (one line on stderr).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pipeline.cli.app import app
from pipeline.cli.connection import announce, connection_options, endpoints_text, load_target
from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.client import InferResult, RequestDeadLettered
    from pipeline.tools.sources import RequestTemplate

EXIT_RESULT = 0
EXIT_ERROR = 1
EXIT_DEAD_LETTER = 2


@app.command()
@connection_options(kafka=True)
def infer(
    topology: Annotated[
        Path, typer.Argument(metavar="TOPOLOGY", help="Topology file of the running topology.", show_default=False)
    ],
    request: Annotated[
        str,
        typer.Argument(
            metavar="REQUEST",
            help="One OIP (KServe v2) JSON request, as text, as @FILE, or - for standard input.",
            show_default=False,
        ),
    ] = "-",
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the outcome; also the deadline header.")
    ] = 30.0,
    lane: Annotated[
        str | None, typer.Option("--lane", help="Priority lane to send to (default: the input topic).")
    ] = None,
) -> None:
    """Send one request to a running topology and print its result or dead letter.

    The request is what `pipeline produce --json` reads: {"inputs": [{"name", "shape",
    "datatype", "data"}], "parameters": {...}, "outputs": [...]}. The outcome goes to
    stdout as one JSON object with "kind" set to "result" or "dead-letter".

    Exit status: 0 result, 2 dead letter, 1 error or timeout.
    """
    from pipeline.client import RequestDeadLettered, SyncClient

    template = _request(request)
    target = load_target(topology)
    assert target.topology is not None
    kafka = target.kafka()
    announce(endpoints_text(kafka=kafka, target=target))
    with SyncClient(target.topology, kafka=kafka, timeout=timeout) as client:
        try:
            result = client.infer(
                template.inputs,
                datatypes=template.datatypes,
                parameters=template.parameters,
                requested_outputs=template.requested_outputs,
                correlation_id=template.own_id,
                lane=lane,
            )
        except RequestDeadLettered as dead:
            _print(_dead_letter_json(dead))
            print(f"dead letter: {dead.error_class}: {dead.reason}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_DEAD_LETTER) from None
    _print(result_json(result))


def _request(text: str) -> RequestTemplate:
    """The one request ``text`` gives: JSON itself, ``@FILE``, or ``-`` (standard input)."""
    import tempfile

    from pipeline.cli.produce import json_requests

    if text == "-" or text.startswith("@"):
        requests = json_requests(Path(text[1:]) if text.startswith("@") else Path("-"))
    else:
        with tempfile.TemporaryDirectory(prefix="pipeline-infer-") as folder:
            path = Path(folder) / "request.json"
            path.write_text(text, encoding="utf-8")
            try:
                requests = json_requests(path)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(str(path), "REQUEST")) from None
    if len(requests) != 1:
        raise ConfigError(f"pipeline infer sends one request; got {len(requests)} (use `pipeline produce --json`)")
    return requests[0]


def result_json(result: InferResult) -> dict[str, Any]:
    """A result as printed: outputs as shape and flat data, with who produced them."""
    return {
        "kind": "result",
        "correlation_id": result.correlation_id,
        "model_name": result.model_name,
        "model_version": result.model_version,
        "outputs": {
            name: {"dtype": str(array.dtype), "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in result.outputs.items()
        },
        "parameters": dict(result.parameters),
    }


def _dead_letter_json(dead: RequestDeadLettered) -> dict[str, Any]:
    return {
        "kind": "dead-letter",
        "correlation_id": dead.correlation_id,
        "error_class": str(dead.error_class),
        "reason": dead.reason,
        "stage": dead.stage,
    }


def _print(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()
