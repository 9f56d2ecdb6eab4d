"""The learner's end of a weight broadcast, run as its own process by
``test_serving_parts`` while the test process serves (so gaca-serve's receiver runs where
the test can see it): the tiny model moved by seed SEED, sent to the server at ROOT as
SGLang's learners send it (per tensor, the fourth in bfloat16; labelled run-v1), then
its second and third tensors again in one ``flattened_bucket`` broadcast in bfloat16
(run-v2); the group is then left.

    python broadcast_probe.py ROOT MODEL_PATH SEED
"""

import sys

import torch


def moved(path: str, seed: int):
    """The tiny model's weights moved by ``seed`` (the test computes them too)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return list(model.state_dict().items())


def main() -> None:
    root, path, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from gaca_agent.generate.server_engine import ServerEngine
    from gaca_agent.generate.transfer import (Broadcaster, broadcast, flatten,
                                              update_by_broadcast)

    torch.set_num_threads(1)
    named = moved(path, seed)
    engine = ServerEngine(root + "/v1", "tiny", None, kind="sglang", retries=0)
    sender = Broadcaster(engine, timeout_s=60, bucket_bytes=1 << 16, group_name="probe")
    mixed = [(n, t.bfloat16() if i == 3 else t) for i, (n, t) in enumerate(named)]
    update_by_broadcast(engine, sender, mixed, "run-v1", 1)
    flat, names, dtypes, shapes = flatten([(n, t.bfloat16()) for n, t in named[1:3]])
    body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": "probe",
            "load_format": "flattened_bucket", "weight_version": "run-v2", "flush_cache": True}
    sender._both(lambda: engine._admin("update_weights_from_distributed", body),
                 lambda: broadcast(flat, sender.group, 60), "the flattened bucket")
    sender.close()


if __name__ == "__main__":
    main()
