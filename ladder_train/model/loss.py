"""The trainer's loss, computed inside the model (``Transformer.forward(..., labels=...)``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # the label of a token that is not scored (torch's cross_entropy default)


class TokenLoss(nn.Module):
    """The summed cross-entropy of the scored labels (not IGNORE_INDEX), from the final hidden states and the head,
    on logits upcast to fp32. A module of its own so that parallel.apply_compile compiles it: inductor then upcasts
    inside the softmax's reductions and keeps only the bf16 logits for the backward, where eager materialises the
    fp32 logits, their log-softmax and its gradient (memory_plan.activation_bytes counts either)."""

    def forward(self, h: torch.Tensor, head: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(h, head).float()
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
