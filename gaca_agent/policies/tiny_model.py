"""A tiny causal LM built from a config, with a tokenizer trained in-process.

No download: a byte-level BPE tokenizer is trained on text the project produces (prompt
templates, diagnostic observations, the think/action format), wrapped with a ChatML chat
template, and a randomly initialised Llama-architecture model of about 0.1 M parameters
is saved beside it. Tests and the CPU demo use it; it loads with ``hf:PATH``.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<action>",
            "</action>"]


def corpus() -> list[str]:
    """Training text for the tokenizer: templates, diag worlds, actions, the format."""
    from gaca_agent.generate.prompts import TEMPLATE_DIR
    from gaca_envs.diag.env import build_world

    texts = [p.read_text() for p in sorted(TEMPLATE_DIR.glob("*.txt"))]
    for world in ("corridor", "signs", "slippery", "pivots"):
        for k in range(64):
            mdp = build_world(world, k)
            texts.append(mdp.task)
            texts.extend(mdp.observations)
            texts.extend(a for acts in mdp.actions for a in acts)
    texts += ["<think>I should walk forward.</think><action>walk forward</action>",
              "go to desk 1, take mug 1 from desk 1, open fridge 1, search[query], click[buy now]"]
    return texts * 3


def build_tokenizer(vocab_size: int = 800):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS[1:2] + SPECIALS[3:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


TINY_VERSION = "3"


def cached_tiny_model(seed: int = 0) -> Path:
    """The tiny model of ``seed``, built once into the cache (``$GACA_CACHE/tiny``);
    concurrent builders race safely (build in a temporary folder, then rename)."""
    import os
    import shutil
    import tempfile

    from gaca_envs.data import cache_dir

    root = cache_dir("tiny")
    path = root / f"v{TINY_VERSION}-seed{seed}"
    if (path / "config.json").exists():
        return path
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    build_tiny_model(tmp / "model", seed=seed)
    try:
        os.replace(tmp / "model", path)
    except OSError:  # another process finished first
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    return path


def build_tiny_model(path: str | Path, seed: int = 0, hidden_size: int = 64,
                     layers: int = 2) -> Path:
    """Save a tiny random model and its tokenizer at ``path``; returns the path.

    Raises if the saved tokenizer encodes differently from the in-memory one (the trap
    where a model-specific tokenizer class swaps the pre-tokenizer on save).
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    reloaded = AutoTokenizer.from_pretrained(path)
    probe = "Corridor, segment 3 of 12. <think>ok</think><action>walk forward</action>"
    if reloaded(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise RuntimeError("saved tokenizer encodes differently from the in-memory one")
    return path
