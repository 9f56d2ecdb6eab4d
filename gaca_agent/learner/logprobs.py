"""Per-token log-probabilities and entropies without a batch x tokens x vocabulary tensor.

A causal LM's last hidden states (N tokens x D) times the output embedding (V x D) give
N x V logits; with Qwen2.5's V = 151,936, 64 prompts x 512 tokens of them are 20 GB in
fp32. Here the logits exist one chunk of tokens at a time (``chunk_tokens`` x V, sized by
:data:`CHUNK_BYTES`), in fp32, and only the chosen token's log-probability (a chunked
logsumexp) and, when asked, the entropy leave the chunk. Under autograd each chunk is
checkpointed: its logits are recomputed in the backward pass instead of being kept.

:func:`forward_token_logprobs` runs a whole (possibly DDP/FSDP-wrapped) model this way:
it intercepts the output embedding's call (forward hooks), so the model's own forward,
wrappers and their collectives run exactly as usual, but the output layer returns per-token
log-probs of the targets instead of logits.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

#: Budget for one chunk of fp32 logits (and the few same-sized temporaries of its softmax).
CHUNK_BYTES = 256 * 2**20


def chunk_tokens_for(vocab: int, budget: int = CHUNK_BYTES) -> int:
    """Tokens per chunk so that a chunk's fp32 logits and ~3 temporaries fit ``budget``."""
    return max(1, budget // (16 * vocab))


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           targets: torch.Tensor, inv_t: float, with_entropy: bool) -> torch.Tensor:
    """(n, D) hidden, (V, D) weight, (n,) targets -> (n, 2): log p(target), entropy.
    The output projection runs in fp32 even under autocast: log-probs of a 150k-token
    vocabulary lose ~3 digits in bf16, which PPO ratios and KL then amplify."""
    with torch.autocast(hidden.device.type, enabled=False):
        logits = torch.nn.functional.linear(hidden.float(), weight.float(),
                                            None if bias is None else bias.float()) * inv_t
    lse = torch.logsumexp(logits, dim=-1)
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    else:
        entropy = torch.zeros_like(chosen)
    return torch.stack([chosen, entropy], dim=-1)


def token_logprobs_from_hidden(hidden: torch.Tensor, weight: torch.Tensor,
                               targets: torch.Tensor, temperature: float = 1.0,
                               bias: torch.Tensor | None = None, with_entropy: bool = False,
                               chunk_tokens: int | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h W^T / T)[target] (and the entropy) for every row of ``hidden``.

    Shapes: hidden (N, D), weight (V, D), targets (N,) -> (N,), (N,) or None. The result is
    fp32. ``temperature`` <= 0 means 1 (greedy decoding records temperature-1 log-probs).
    """
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    n = hidden.shape[0]
    step = chunk_tokens or chunk_tokens_for(weight.shape[0])
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    parts = []
    for start in range(0, n, step):
        args = (hidden[start:start + step], weight, bias, targets[start:start + step], inv_t,
                with_entropy)
        parts.append(checkpoint(_chunk, *args, use_reentrant=False) if grad else _chunk(*args))
    out = torch.cat(parts) if parts else hidden.new_zeros((0, 2), dtype=torch.float32)
    return out[:, 0], (out[:, 1] if with_entropy else None)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor,
                         temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T)[target] for a (B, V) step of generation (fp32, (B,))."""
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    scaled = logits.float() * inv_t
    return scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, -1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) for a (B, V) step of generation (fp32, (B,))."""
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    scaled = logits.float() * inv_t
    lse = torch.logsumexp(scaled, -1)
    probs = torch.softmax(scaled, -1)
    return lse - (probs * scaled.masked_fill(probs == 0, 0.0)).sum(-1)  # -inf logits: 0


def output_layer(model) -> torch.nn.Module:
    """The output embedding module of a (possibly wrapped) transformers causal LM."""
    inner = model
    while hasattr(inner, "module") and not hasattr(inner, "get_output_embeddings"):
        inner = inner.module  # DDP and similar wrappers
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(inner).__name__} has no output embedding layer")
    return head


def forward_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                           positions: torch.Tensor, targets: torch.Tensor,
                           temperature: float = 1.0, with_entropy: bool = False,
                           position_ids: torch.Tensor | None = None,
                           chunk_tokens: int | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs of ``targets`` from one forward pass of ``model``.

    Shapes: input_ids, attention_mask (B, L); positions, targets (B, T): position
    ``positions[b, j]`` of row b predicts ``targets[b, j]``. Returns (B, T) log-probs
    (fp32) and, with ``with_entropy``, (B, T) entropies. The model is called through its
    own forward (so DDP/FSDP hooks, autocast and gradient checkpointing apply); its output
    layer is intercepted and computes :func:`token_logprobs_from_hidden` on the gathered
    positions instead of logits over the whole sequence.
    """
    head = output_layer(model)
    stash: dict[str, torch.Tensor] = {}
    B, T = targets.shape

    def pre_hook(module, args):
        stash["hidden"] = args[0]
        return (args[0][:, :0],)  # the layer itself computes nothing

    def post_hook(module, args, output):
        hidden = stash.pop("hidden")
        idx = positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        picked = hidden.gather(1, idx).reshape(B * T, -1)
        logp, ent = token_logprobs_from_hidden(
            picked, module.weight, targets.reshape(-1), temperature,
            getattr(module, "bias", None), with_entropy, chunk_tokens)
        ent = ent if ent is not None else torch.zeros_like(logp)
        return torch.stack([logp, ent], -1).reshape(B, T, 2)

    handles = [head.register_forward_pre_hook(pre_hook),
               head.register_forward_hook(post_hook)]
    try:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask,
                  "use_cache": False}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        out = model(**kwargs).logits
    finally:
        for h in handles:
            h.remove()
    return out[..., 0], (out[..., 1] if with_entropy else None)
