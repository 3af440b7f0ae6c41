"""The paper's reported numbers, stored once (Zhang, Mishra et al., "Ladder-residual: parallelism-aware
architecture for accelerating large model inference with communication overlapping", ICML 2025, arXiv 2501.06589).

Everything the package prints or tests beside its own measurements comes from here, each figure as the paper
gives it (nothing rounded further, nothing guessed):

- ``PRETRAINING``: Table 3 (100B FineWeb-Edu tokens): the six zero-shot accuracies per task, their average, Wikitext
  perplexity and the inference throughput column, for every row of the table;
- ``ADAPTATION``: the adaptation of Llama-3.1-8B-Instruct to a hybrid ladder, per benchmark;
- ``INFERENCE_TP8_70B``: the inference table of one H100 node at TP 8, all 16 cells.

Each row's stated average reproduces from its own columns to the paper's two decimals; ``tests/test_paper.py``
checks that, so a mistyped cell fails a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# the six accuracy tasks the paper averages (its Table 3), in lm-eval's task names; with Wikitext perplexity
# they are the paper's evaluation, and the default of eval.tasks
AVERAGED_TASKS = ("arc_challenge", "arc_easy", "hellaswag", "piqa", "sciq", "winogrande")
PAPER_TASKS = (*AVERAGED_TASKS, "wikitext")


@dataclass(frozen=True)
class PretrainingRow:
    """One row of Table 3. ``tasks``: the accuracy in percent of each of ``AVERAGED_TASKS``, as the paper prints
    it; ``avg6``: the paper's stated average of those six (which of acc / acc_norm each task contributes is not
    stated in the paper); ``wikitext_ppl``: Wikitext perplexity; ``tokens_per_s``: the table's inference
    throughput column, given for four rows only (None where the paper leaves the cell empty)."""

    size: str  # the preset name, e.g. "1.2B"
    residual: str
    avg6: float
    wikitext_ppl: float
    note: str = ""
    tasks: dict[str, float] = field(default_factory=dict)
    tokens_per_s: float | None = None


_DEEPER = (
    "52 layers at the {width} width: more parameters than standard {width} and still faster at inference in the "
    "paper ({fast} vs {slow} tokens/s); not throughput-matched"
)


def _row(size, residual, accuracies, avg6, ppl, tokens_per_s=None, note=""):
    tasks = dict(zip(AVERAGED_TASKS, accuracies, strict=True))
    return PretrainingRow(size, residual, avg6, ppl, note, tasks, tokens_per_s)


# Table 3: columns ARC-C, ARC-E, HellaSwag, PIQA, SciQ, Winogrande (accuracy, %), then the average, Wikitext
# perplexity and tokens/s, exactly as the paper prints them.
PRETRAINING = (
    _row("1.2B", "standard", (34.22, 70.33, 41.10, 71.49, 87.30, 55.41), 59.98, 18.54, 1008.29),
    _row("1.2B", "parallel", (30.46, 67.97, 40.35, 71.16, 87.40, 55.17), 58.75, 18.95),
    _row("1.2B", "ladder", (31.31, 67.76, 41.18, 71.49, 86.60, 55.17), 58.92, 18.42),
    _row(
        "1.5B",
        "ladder",
        (33.96, 70.16, 42.58, 71.98, 87.90, 55.41),
        60.33,
        17.47,
        1277.66,
        _DEEPER.format(width="1.2B", fast=1277.66, slow=1008.29),
    ),
    _row("3.5B", "standard", (38.99, 74.12, 46.48, 74.59, 92.00, 58.48), 64.11, 14.48, 949.6),
    _row("3.5B", "parallel", (38.48, 73.02, 45.55, 73.67, 90.00, 57.46), 63.03, 14.96),
    _row("3.5B", "ladder", (36.77, 72.43, 45.66, 73.72, 89.90, 58.96), 62.91, 14.90),
    _row(
        "4.5B",
        "ladder",
        (40.96, 75.00, 46.81, 73.99, 90.80, 57.70),
        64.21,
        14.05,
        1217.71,
        _DEEPER.format(width="3.5B", fast=1217.71, slow=949.6),
    ),
)


def pretraining_row(size: str | None, residual: str | None) -> PretrainingRow | None:
    return next((row for row in PRETRAINING if (row.size, row.residual) == (size, residual)), None)


# ------------------------------------------------------------------------------------------------- inference

# The inference table at TP 8 on one H100 node, prompt 1024, 512 new tokens, bf16. The paper does not name the model
# beside it; its batch-4 speedup with P2P (1.282x) matches the 70B row of the paper's size table (1.29x), so:
# Llama 70B, inferred. Speedups are end-to-end throughput ratios over standard's, prefill included. "P2P disabled"
# is NCCL with NCCL_P2P_DISABLE=1 (all-reduces through host memory). Each row: batch 1, 4, 16, 64.
INFERENCE_BATCHES = (1, 4, 16, 64)
INFERENCE_TP8_70B = {
    ("standard tokens/s", "P2P enabled"): (77.39, 258.56, 843.15, 1940.99),
    ("ladder speedup", "P2P enabled"): (1.308, 1.282, 1.190, 1.155),
    ("standard tokens/s", "P2P disabled"): (51.66, 173.62, 546.68, 1454.42),
    ("ladder speedup", "P2P disabled"): (1.599, 1.566, 1.351, 1.282),
}
# batch -> (standard tokens/s with P2P, ladder speedup with P2P, ladder speedup with P2P disabled): the same
# cells, in the shape older callers read
_KEYS = (("standard tokens/s", "P2P enabled"), ("ladder speedup", "P2P enabled"), ("ladder speedup", "P2P disabled"))
INFERENCE_TP8_70B_INFERRED = {
    batch: tuple(INFERENCE_TP8_70B[key][i] for key in _KEYS) for i, batch in enumerate(INFERENCE_BATCHES)
}
# the paper's size table, batch 4, P2P enabled: ladder speedup by model size (70B also in the table above)
SIZE_TABLE_BATCH4_SPEEDUP = {"70B": 1.29, "405B": 1.31}
COMM_SHARE_70B_TP8 = 0.38  # the paper: communication was 38 % of the latency for 70B at TP 8 (batch, link not stated)


# ------------------------------------------------------------------------------------------------ adaptation

# The adaptation of pretrained Llama-3.1-8B-Instruct (32 layers) to a hybrid ladder: its upper N layers converted,
# evaluated as converted (zero-shot) and after retraining on Infinity-Instruct (2 epochs, AdamW lr 5e-6, batch 32,
# 200 warmup steps, cosine). The retraining budget: 3B tokens in the paper's text, 1.6B in its slides.
ADAPTATION_BENCHMARKS = (
    "MMLU",
    "ARC-C",
    "OBQA",
    "HellaSwag",
    "TruthfulQA",
    "GSM8K",
    "HumanEval+",
    "IFEval",
    "AlpacaEval 2",
)
ADAPTATION_RETRAIN_TOKENS = {"paper text": 3.0e9, "paper slides": 1.6e9}


@dataclass(frozen=True)
class AdaptationRow:
    """One row of the adaptation table: ``ladder_layers`` (None for the original model) of 32 converted,
    ``retrained`` or zero-shot, the score per benchmark of ``ADAPTATION_BENCHMARKS`` and the paper's average."""

    name: str
    ladder_layers: int | None
    retrained: bool
    scores: dict[str, float]
    average: float


def _adapted(name, ladder_layers, retrained, scores, average):
    return AdaptationRow(name, ladder_layers, retrained, dict(zip(ADAPTATION_BENCHMARKS, scores, strict=True)), average)


ADAPTATION = (
    _adapted(
        "Llama-3.1-8B-Instruct", None, False, (68.14, 60.32, 43.00, 80.04, 36.84, 84.99, 60.40, 52.57, 18.69), 56.11
    ),
    _adapted(
        "Hybrid-Ladder-8B-16L zero-shot",
        16,
        False,
        (63.19, 56.57, 42.60, 77.70, 35.50, 10.54, 30.50, 46.25, 11.99),
        41.65,
    ),
    _adapted(
        "Hybrid-Ladder-8B-16L retrained",
        16,
        True,
        (67.33, 59.98, 45.00, 79.05, 37.58, 86.81, 60.51, 59.76, 22.43),
        57.61,
    ),
    _adapted(
        "Hybrid-Ladder-8B-20L retrained",
        20,
        True,
        (62.31, 59.90, 42.60, 77.49, 36.72, 76.19, 48.80, 59.05, 21.72),
        53.86,
    ),
)
# the averages by a readable name (the same figures as ADAPTATION's ``average``)
ADAPTATION_LLAMA31_8B = {
    "original": ADAPTATION[0].average,
    "ladder 16 of 32 layers, zero-shot (no retraining)": ADAPTATION[1].average,
    "ladder 16 of 32 layers, retrained": ADAPTATION[2].average,
    "ladder 20 of 32 layers, retrained": ADAPTATION[3].average,
}
ADAPTATION_GSM8K_ZERO_SHOT = ADAPTATION[1].scores["GSM8K"]  # GSM8K after the conversion, before retraining
ADAPTATION_SPEEDUP = 1.21  # the hybrid's inference speedup the paper reports for the adapted model
