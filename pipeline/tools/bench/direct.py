"""The same requests as direct Triton gRPC calls: the baseline the pipeline is compared with.

Each call carries one request's tensors, as its Kafka record does (the same
rows), to the topology's first model; batching is then Triton's own dynamic
batcher, where the topology's stage batches before calling. The client comes
from :func:`pipeline.triton.client.aio_client`, so TLS and channel settings are
the workers'. Answers are checked by the same :class:`~.verify.OutputVerifier`.
"""

from __future__ import annotations

import time

from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from pipeline.contract.errors import one_line
from pipeline.settings import TritonSettings
from pipeline.tools.bench.stats import Outcome, StepStats
from pipeline.tools.bench.verify import OutputVerifier
from pipeline.tools.bench.workload import Workload
from pipeline.tools.sources import RequestTemplate
from pipeline.triton.client import aio_client


class DirectPath:
    """``await path.call(stats)`` is one ``ModelInfer`` call of the workload's model."""

    def __init__(self, triton: TritonSettings, workload: Workload, model_version: str, timeout_s: float) -> None:
        self.model = workload.model.name
        self.model_version = model_version
        self.rows = workload.rows
        self.timeout_s = timeout_s
        self._client = aio_client(triton)
        self._verifier = OutputVerifier(workload.model)
        self._outputs = [output.name for output in workload.model.outputs]
        self._templates = workload.cycle()

    async def close(self) -> None:
        await self._client.close()

    async def call(self, stats: StepStats) -> None:
        inputs = _inputs(next(self._templates))
        sent = time.monotonic()
        stats.sent(sent)
        try:
            response = await self._client.infer(
                self.model,
                inputs,
                model_version=self.model_version,
                outputs=[InferRequestedOutput(name) for name in self._outputs],
                client_timeout=self.timeout_s,
            )
        except InferenceServerException as exc:
            ended = time.monotonic()
            timed_out = "DEADLINE_EXCEEDED" in str(exc.status()) or ended - sent >= self.timeout_s
            outcome = Outcome.MISSING if timed_out else Outcome.SEND_FAILED
            stats.ended(outcome, ended, error=one_line(exc.message() or str(exc)))
            return
        arrived = time.monotonic()
        arrays = {name: response.as_numpy(name) for name in self._outputs}
        present = {name: array for name, array in arrays.items() if array is not None}
        datatypes = {output.name: output.datatype for output in response.get_response().outputs}
        problem = self._verifier.problem(present, datatypes, self.rows)
        if problem:
            stats.ended(Outcome.INVALID, arrived, error=problem)
        else:
            stats.ended(Outcome.VERIFIED, arrived, latency_ms=(arrived - sent) * 1000)


def _inputs(template: RequestTemplate) -> list[InferInput]:
    tensors = []
    for name, array in template.inputs.items():
        tensor = InferInput(name, list(array.shape), template.datatypes[name])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors

