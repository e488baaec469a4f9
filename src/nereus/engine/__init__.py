"""engine layer: a Llama-style decoder computed in TP, PP and DP on the runtime's sharded state.

``ParallelModel`` (the decoder over one worker's shards), ``TrainStep`` (1F1B, gradient sums,
global-norm clip, Adam), ``Generator`` (KV-cache sampling), ``StageEngine`` (one worker's
operations, measured) and ``nereus.engine.runner.StageRunner`` (a model-stage's operations over
its EMUs' workers; imported from its module so that this package does not start Ray).
"""

from nereus.engine.batch import Batch
from nereus.engine.generate import GenerationResult, Generator
from nereus.engine.groups import ParallelGroups, Position
from nereus.engine.measure import StageMeasurement, WorkerMeasurement
from nereus.engine.model import ParallelModel
from nereus.engine.optim import AdamConfig, AdamState
from nereus.engine.pipeline import Output
from nereus.engine.sampling import SamplingParams
from nereus.engine.stage import StageEngine
from nereus.engine.train import TrainResult, TrainStep

__all__ = ["AdamConfig", "AdamState", "Batch", "GenerationResult", "Generator", "Output",
           "ParallelGroups", "ParallelModel", "Position", "SamplingParams", "StageEngine",
           "StageMeasurement", "TrainResult", "TrainStep", "WorkerMeasurement"]
