"""``gaca-train``'s typed configuration: the sections (:mod:`.sections`) and loading them
from YAML plus ``key=value`` overrides (:mod:`.load`)."""

from gaca_agent.config.load import (check_type, config_names, config_path, load_config,
                                    to_dict)
from gaca_agent.config.sections import (SECTIONS, AlgoSection, ClusterSection, EnvSection,
                                        ModelSection, ServerSection, TrainConfig,
                                        WarmupSection)

__all__ = ["AlgoSection", "ClusterSection", "EnvSection", "ModelSection", "SECTIONS",
           "ServerSection", "TrainConfig", "WarmupSection", "check_type", "config_names",
           "config_path", "load_config", "to_dict"]
