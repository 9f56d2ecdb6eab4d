"""``hf:PATH``: a local transformers causal LM, sampled in one batch across live envs.

Sampling uses only temperature (no top-k, no top-p), so the per-token
log-probabilities recorded from the sampling distribution equal those of a
teacher-forced pass with the same temperature. Tokens after the first end-of-sequence
token are dropped. ``temperature=0`` decodes greedily and records temperature-1
log-probabilities.
"""

from __future__ import annotations

from typing import Any, Sequence

from gaca_agent.prompts import PromptBuilder, parse_response
from gaca_agent.types import ActionOutput, Turn


class HFPolicy:
    """A causal LM policy (chat template, left padding, batched generation)."""

    needs_expert = False

    def __init__(self, model: Any, tokenizer: Any = None, temperature: float = 1.0,
                 max_new_tokens: int = 128, history_length: int = 2,
                 template_file: str | None = None, system_prompt: str | None = None,
                 batch_size: int = 64, device: str | None = None, seed: int | None = None,
                 max_prompt_tokens: int | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            model = AutoModelForCausalLM.from_pretrained(model)
        if tokenizer is None:
            raise ValueError("pass the tokenizer with a model object")
        self.model, self.tokenizer = model, tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.temperature, self.max_new_tokens = float(temperature), int(max_new_tokens)
        self.prompts = PromptBuilder(history_length, template_file)
        self.system_prompt, self.batch_size = system_prompt, batch_size
        self.max_prompt_tokens = max_prompt_tokens
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
            torch.manual_seed(seed)

    # ------------------------------------------------------------- prompts
    def chat(self, turn: Turn) -> str:
        messages = ([{"role": "system", "content": self.system_prompt}]
                    if self.system_prompt else [])
        messages.append({"role": "user", "content": self.prompts.build(turn)})
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)

    def eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ------------------------------------------------------------- acting
    def act(self, turns: Sequence[Turn]) -> list[ActionOutput]:
        outputs: list[ActionOutput] = []
        for start in range(0, len(turns), self.batch_size):
            outputs += self.generate([self.chat(t) for t in turns[start:start + self.batch_size]])
        return outputs

    def generate(self, prompts: list[str]) -> list[ActionOutput]:
        import torch

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True,
                             add_special_tokens=False, truncation=self.max_prompt_tokens is not None,
                             max_length=self.max_prompt_tokens).to(self.device)
        greedy = self.temperature <= 0
        # A fresh generation config: a model's own (Qwen2.5 ships top_k=20, top_p=0.8)
        # would filter the sampling distribution and break exact log-probs.
        from transformers import GenerationConfig

        # top_k must be 0 (not None, which means the default top-k of 50) to disable it.
        sampling = {} if greedy else {"temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        gen_config = GenerationConfig(
            do_sample=not greedy, max_new_tokens=self.max_new_tokens,
            eos_token_id=sorted(self.eos_ids()), pad_token_id=self.tokenizer.pad_token_id,
            output_scores=True, return_dict_in_generate=True, **sampling)
        self.model.eval()
        with torch.no_grad():
            gen = self.model.generate(**enc, generation_config=gen_config)
        new = gen.sequences[:, enc["input_ids"].shape[1]:]
        logp = torch.stack(gen.scores, dim=1).float().log_softmax(-1)  # (B, T, V)
        token_lp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
        return [self._output(enc, new, token_lp, entropy, b) for b in range(len(prompts))]

    def _output(self, enc, new, token_lp, entropy, b: int) -> ActionOutput:
        mask = enc["attention_mask"][b].bool()
        prompt_ids = enc["input_ids"][b][mask].tolist()
        ids = new[b].tolist()
        eos = self.eos_ids()
        end = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
        ids = ids[:end]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        for special in (self.tokenizer.eos_token, self.tokenizer.pad_token):
            if special and text.endswith(special):
                text = text[: -len(special)]
        offsets, pos = [], 0
        for tid in ids:  # character start of each token in the decoded text (approximate
            offsets.append(pos)  # for tokens that split a multi-byte character)
            pos += len(self.tokenizer.decode([tid], skip_special_tokens=False))
        action, valid = parse_response(text)
        return ActionOutput(text, action, valid, prompt_ids, ids,
                            token_lp[b, :end].tolist(), entropy[b, :end].tolist(),
                            extra={"token_offsets": offsets})


def teacher_forced_logprobs(model, prompt_ids: list[int], completion_ids: list[int],
                            temperature: float = 1.0):
    """Log-probabilities of ``completion_ids`` after ``prompt_ids`` in one forward pass,
    at ``temperature`` (1 for greedy), shape (len(completion_ids),)."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    t = temperature if temperature > 0 else 1.0
    logp = (logits / t).log_softmax(-1)
    return logp.gather(-1, torch.tensor(completion_ids, device=model.device)[:, None]).squeeze(-1)
