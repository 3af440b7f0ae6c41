"""The paper's reported numbers, stored once (Zhang, Mishra et al., ICML 2025, arXiv 2501.06589).

Everything the package prints or tests beside its own measurements comes from here: the pretraining table
(Table 3: 100B FineWeb-Edu tokens, zero-shot accuracy and Wikitext perplexity) and the inference table of
one H100 node at TP 8.
"""

from __future__ import annotations

from dataclasses import dataclass

# the six accuracy tasks the paper averages (its Table 3), in lm-eval's task names; with Wikitext perplexity
# they are the paper's evaluation, and the default of eval.tasks
AVERAGED_TASKS = ("arc_challenge", "arc_easy", "hellaswag", "piqa", "sciq", "winogrande")
PAPER_TASKS = (*AVERAGED_TASKS, "wikitext")


@dataclass(frozen=True)
class PretrainingRow:
    """One row of Table 3. ``avg6`` is the six-task average accuracy in percent (which of acc / acc_norm each
    task contributes is not stated). The per-task columns are not stored: they were not available to the
    project when this table was entered, and are not guessed."""

    size: str  # the preset name, e.g. "1.2B"
    residual: str
    avg6: float
    wikitext_ppl: float
    note: str = ""


PRETRAINING = (
    PretrainingRow("1.2B", "standard", 59.98, 18.54),
    PretrainingRow("1.2B", "parallel", 58.75, 18.95),
    PretrainingRow("1.2B", "ladder", 58.92, 18.42),
    PretrainingRow(
        "1.5B",
        "ladder",
        60.33,
        17.47,
        note="52 layers at the 1.2B width: more parameters than standard 1.2B and still faster at inference in "
        "the paper (1277.66 vs 1008.29 tokens/s); not throughput-matched",
    ),
    PretrainingRow("3.5B", "standard", 64.11, 14.48),
    PretrainingRow("3.5B", "parallel", 63.03, 14.96),
    PretrainingRow("3.5B", "ladder", 62.91, 14.90),
    PretrainingRow(
        "4.5B",
        "ladder",
        64.21,
        14.05,
        note="52 layers at the 3.5B width: more parameters than standard 3.5B and still faster at inference in "
        "the paper (1217.71 vs 949.6 tokens/s); not throughput-matched",
    ),
)

# The inference table at TP 8 on one H100 node, prompt 1024, 512 new tokens. The paper does not name the model
# beside it; its batch-4 speedup (1.282x) matches the 70B row of the paper's size table (1.29x), so: Llama 70B,
# inferred. batch -> (standard tokens/s, ladder speedup with NVLink P2P, ladder speedup with P2P disabled);
# speedups are end-to-end throughput ratios, prefill included.
INFERENCE_TP8_70B_INFERRED = {
    1: (77.4, 1.308, 1.599),
    4: (258.6, 1.282, 1.566),
    16: (843.2, 1.190, 1.351),
    64: (1941, 1.155, 1.282),
}


def pretraining_row(size: str | None, residual: str | None) -> PretrainingRow | None:
    return next((row for row in PRETRAINING if (row.size, row.residual) == (size, residual)), None)


# The adaptation of pretrained Llama-3.1-8B-Instruct (its upper 16 or 20 of 32 layers converted to ladder), as
# entered from the paper's summary in the project's issue 16: average accuracy over the paper's adaptation benchmarks (GSM8K among
# them) before and after retraining on 3B tokens of Infinity-Instruct (2 epochs, AdamW lr 5e-6, batch 32, 200
# warmup steps, cosine). The zero-shot figure's number of converted layers is not stated in that summary.
ADAPTATION_LLAMA31_8B = {
    "original": 56.11,
    "ladder, zero-shot (no retraining)": 41.65,
    "ladder 16 of 32 layers, retrained": 57.61,
    "ladder 20 of 32 layers, retrained": 53.86,
}
ADAPTATION_GSM8K_ZERO_SHOT = 10.54  # GSM8K after the conversion, before retraining
ADAPTATION_SPEEDUP = 1.21  # the hybrid's inference speedup the paper reports for the adapted model
