"""``hf:PATH``: a local transformers causal LM, sampled through a rollout engine.

Prompts are chat-formatted and tokenized here; generation, exact sampled log-probs and
the step's span NLLs come from the engine (:mod:`gaca_agent.generate.engines`: ``hf`` by
default, ``paged`` for transformers' continuous batching). Sampling uses only the
temperature (no top-k, no top-p), so the recorded log-probs equal those of a
teacher-forced pass at the same temperature. ``temperature=0`` decodes greedily and
records temperature-1 log-probs. A turn that carries a sampling key (the collector sets
one per episode and step when the episode has a seed) is sampled from that key alone, so
an episode's responses do not depend on the other episodes in its batch (``hf`` engine).
"""

from __future__ import annotations

from typing import Any, Sequence

from gaca_agent.generate.factory import InProcess
from gaca_agent.generate.prompts import PromptBuilder, parse_response
from gaca_agent.types import ActionOutput, Turn


class HFPolicy:
    """A causal LM policy: chat template, one engine call for all live turns."""

    needs_expert = False

    def __init__(self, model: Any, tokenizer: Any = None, temperature: float = 1.0,
                 max_new_tokens: int = 128, history_length: int = 2,
                 template_file: str | None = None, system_prompt: str | None = None,
                 batch_size: int = 64, device: str | None = None, seed: int | None = None,
                 max_prompt_tokens: int | None = None, engine: InProcess = "hf",
                 with_entropy: bool = False, dtype: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from gaca_agent.generate.factory import make_engine

        if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16), "
                             f"got {dtype!r}")
        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model)
        if dtype is not None:  # bfloat16: 2-3x faster on a CPU with AMX or AVX512-BF16
            model = model.to(getattr(torch, str(dtype)))
        if tokenizer is None:
            raise ValueError("pass the tokenizer with a model object")
        self.model, self.tokenizer = model, tokenizer
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if str(dtype) == "bfloat16":  # slower than fp32 where it is not native
            from gaca_agent.learner.precision import warn_if_slow

            warn_if_slow(torch.device(self.device), "dtype=bfloat16", "leave dtype out")
        self.model.to(self.device)
        self.temperature, self.max_new_tokens = float(temperature), int(max_new_tokens)
        self.prompts = PromptBuilder(history_length, template_file)
        self.system_prompt = system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        kwargs = {"batch_size": batch_size, "with_entropy": with_entropy} if engine == "hf" else {}
        self.engine = make_engine(engine, self.model, self.tokenizer, self.device, **kwargs)
        if seed is not None:
            torch.manual_seed(seed)

    # ------------------------------------------------------------- prompts
    def chat(self, turn: Turn) -> str:
        messages = self.prompts.messages(turn, self.system_prompt)
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)

    def prompt_ids(self, turn: Turn) -> tuple[int, ...]:
        """The turn's prompt tokens; a prompt over ``max_prompt_tokens`` keeps its end
        (the newest observation and the assistant header) and loses its beginning."""
        ids = self.tokenizer(self.chat(turn), add_special_tokens=False)["input_ids"]
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            ids = ids[-self.max_prompt_tokens:]
        return tuple(ids)

    # ------------------------------------------------------------- acting
    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        from gaca_agent.generate.engines import Request

        requests = [Request(self.prompt_ids(t), self.max_new_tokens, self.temperature,
                            key=t.key) for t in turns]
        return [to_output(c) for c in self.engine.generate(requests)]


def to_output(completion) -> ActionOutput:
    """A policy's answer from an engine completion (action parsed from the text)."""
    action, valid = parse_response(completion.text)
    extra = {} if completion.token_source == "engine" else {
        "token_source": completion.token_source, "model": completion.model}
    if getattr(completion, "policy_version", None) is not None:
        extra["policy_version"] = completion.policy_version
    return ActionOutput(completion.text, action, valid, list(completion.prompt_ids),
                        completion.completion_ids, completion.logprobs,
                        completion.entropies, nll=dict(completion.nll), extra=extra)
