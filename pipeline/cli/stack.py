"""``pipeline up`` / ``pipeline down``: the embedded stack in the foreground."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import typer
from rich.table import Table

from pipeline.cli.app import app, console
from pipeline.embedded.stack import EmbeddedStack, default_broker
from pipeline.endpoints import clear_stack_state, read_stack_state, state_file, write_stack_state
from pipeline.errors import ConfigError, PipelineError

_SECRETS = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"})
"""Variables of the stack's environment that are credentials: written to the state file, never printed."""


class _Stop(Exception):
    """Raised from the signal handler to leave the foreground wait."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signal.Signals(signum).name)


@app.command()
def up(
    models: Path = typer.Option(
        None,
        "--models",
        help="Triton model repository to push to the S3 store (default: ./sample_models).",
        exists=True,
        file_okay=False,
        resolve_path=True,
    ),
    log_dir: Path = typer.Option(
        None, "--log-dir", help="Where service logs go (default: a fresh temporary folder)."
    ),
    broker: str = typer.Option(
        None,
        "--broker",
        help="Kafka broker: 'kafka' (Apache Kafka, KRaft; idempotence, transactions, replication; "
        "needs Java 17 and its jars, which `scripts/install.sh` fetches where Java and Maven are) or "
        "'tansu' (small, starts at once). Default: $PIPELINE_EMBEDDED_BROKER, else 'kafka' where it "
        "is installed, else 'tansu'.",
        show_default=False,
    ),
    brokers: int = typer.Option(1, "--brokers", min=1, help="Number of Apache Kafka nodes (with --broker kafka)."),
    tritons: int = typer.Option(
        1, "--tritons", min=1, help="Number of Triton servers on the one model store (the stages spread over them)."
    ),
) -> None:
    """Start the embedded stack (Kafka broker, S3 model store, Triton) in the foreground.

    Prints the endpoints and the environment variables that point other tools at
    them. Ctrl-C, SIGTERM or `pipeline down` stops every service.
    """
    if read_stack_state() is not None:
        raise PipelineError(f"an embedded stack is already running (state in {state_file()})")
    broker = broker or default_broker()
    if broker not in ("tansu", "kafka"):
        raise ConfigError(f"--broker must be 'tansu' or 'kafka', not {broker!r}")
    if brokers > 1 and broker != "kafka":
        raise ConfigError("--brokers N needs --broker kafka (Tansu runs one node)")
    stack = EmbeddedStack(
        model_repository=models,
        log_dir=log_dir,
        broker="kafka" if broker == "kafka" else "tansu",
        brokers=brokers,
        tritons=tritons,
    )
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    try:
        with console.status("starting embedded stack") as status:
            endpoints = stack.start(progress=lambda msg: status.update(msg))
        env = endpoints.environment()
        write_stack_state(env, stack.log_dir)
        _print_endpoints(env, stack, time.monotonic() - started)
        while True:
            dead = stack.dead()
            if dead:
                names = ", ".join(p.name for p in dead)
                raise PipelineError(f"{names} exited unexpectedly; see logs in {stack.log_dir}")
            time.sleep(0.5)
    except _Stop as stop:
        console.print(f"{stop}: stopping")
    finally:
        stack.stop()
        clear_stack_state()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("embedded stack stopped")


@app.command()
def down(
    timeout: float = typer.Option(30.0, help="Seconds to wait for the stack to stop."),
) -> None:
    """Stop the embedded stack started by `pipeline up` (from another terminal)."""
    state = read_stack_state()
    if state is None:
        raise ConfigError("no embedded stack is running")
    pid = state["pid"]
    assert isinstance(pid, int)  # read_stack_state returns only states with an integer pid
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if read_stack_state() is None:
            console.print(f"stopped embedded stack (pid {pid})")
            return
        time.sleep(0.2)
    raise PipelineError(f"embedded stack (pid {pid}) did not stop within {timeout:.0f}s")


def _print_endpoints(env: dict[str, str], stack: EmbeddedStack, elapsed: float) -> None:
    table = Table(title=f"embedded stack ready in {elapsed:.1f}s", title_justify="left")
    table.add_column("service")
    table.add_column("endpoint")
    table.add_row(f"Kafka (bootstrap, {stack.broker})", env.get("PIPELINE_KAFKA_BOOTSTRAP_SERVERS", "-"))
    table.add_row("S3 model store", f"{env.get('PIPELINE_S3_ENDPOINT', '-')}  bucket={env.get('PIPELINE_S3_BUCKET', '-')}")
    table.add_row("Triton gRPC", env.get("PIPELINE_TRITON_GRPC_URL", "-"))
    table.add_row("Triton HTTP", env.get("PIPELINE_TRITON_HTTP_URL", "-"))
    table.add_row("Triton metrics", env.get("PIPELINE_TRITON_METRICS_URL", "-"))
    table.add_row("logs", str(stack.log_dir))
    console.print(table)
    if stack.kafka is not None:
        console.print(stack.kafka.summary(), highlight=False)
    console.print("Point other tools at it (other `pipeline` commands find it by themselves):")
    for key, value in env.items():
        if key not in _SECRETS:
            console.print(f"export {key}={value}", highlight=False, soft_wrap=True)
    console.print(
        f"S3 keys: random for this stack, kept in {state_file()} (readable by you only), never printed; "
        "the embedded S3 store accepts any key.",
        highlight=False,
        soft_wrap=True,
    )
    console.print("Press Ctrl-C (or run `pipeline down`) to stop.")
