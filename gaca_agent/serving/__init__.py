"""``gaca-serve``'s parts: the chat API's request checks and response shapes
(:mod:`protocol`), the batcher that feeds the rollout engine (:mod:`batcher`), the LoRA
adapters it serves beside the base model (:mod:`adapters`), incremental streaming
(:mod:`stream`). The HTTP server and command line are :mod:`gaca_agent.serving.app`."""
