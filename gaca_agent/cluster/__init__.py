"""Running gaca's parts on a Ray cluster (``cluster.backend: ray``, docs/cluster.md).

The only package that imports ``ray``. :mod:`.ray_pool` places the env workers as Ray
actors that run the same env code as a local worker process
(:class:`~gaca_agent.collect.workers.EnvHost`), with the same slot routing and restarts
(:class:`~gaca_agent.collect.workers.HostPool`).
"""
