"""Typed run configuration: one YAML file -> a frozen `RunConfig`."""

from .data import DataSection
from .engines import (
    BackendsSection,
    MegatronSection,
    PayloadsSection,
    VLLMSection,
    WeightsSection,
)
from .learning import AlgorithmSection, LoraSection, ModelSection
from .load import (
    ConfigError,
    config_from_dict,
    config_to_dict,
    describe_fields,
    dump_config,
    load_config,
)
from .pipeline import pipeline_for, workers_to_start
from .placement import NodeGroup, PlacementSection
from .schema import (
    WORKER_ROLES,
    LoggingSection,
    PipelineSection,
    RunConfig,
    RunSection,
    SchedulerSection,
)

__all__ = [
    "WORKER_ROLES",
    "AlgorithmSection",
    "BackendsSection",
    "ConfigError",
    "DataSection",
    "LoggingSection",
    "LoraSection",
    "MegatronSection",
    "ModelSection",
    "NodeGroup",
    "PayloadsSection",
    "PipelineSection",
    "PlacementSection",
    "RunConfig",
    "RunSection",
    "SchedulerSection",
    "VLLMSection",
    "WeightsSection",
    "config_from_dict",
    "config_to_dict",
    "describe_fields",
    "dump_config",
    "load_config",
    "pipeline_for",
    "workers_to_start",
]
