"""gaca inside other trainers and tools: TRL and verifiers environments, verl advantage
estimators, Hugging Face datasets of rollouts. Each module imports its package only when
used."""
