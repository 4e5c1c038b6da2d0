"""Stateful streams through a Triton sequence model (see :mod:`workers.sequence.stage`).

- :mod:`.chunks`: parse a chunk, decide where it goes in its stream's order;
- :mod:`.state`: a stream's checkpointed progress, framing;
- :mod:`.model`: Triton's sequence batcher, resume with explicit state;
- :mod:`.postprocess`: what is emitted besides chunk outputs (VAD segments);
- :mod:`.results`: result records; :mod:`.stage`: the stage that ties them together.
"""

from workers.sequence.settings import SequenceSettings
from workers.sequence.stage import SequenceStage

__all__ = ["SequenceSettings", "SequenceStage"]
