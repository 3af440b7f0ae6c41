"""An export's model card: ``README.md`` with the Hugging Face Hub's metadata block (licence, library, tags,
datasets) and what a reader needs to trust and load the model: layout, shape, tokenizer, training data and
tokens, the run's eval results, the paper, and how to load it (with what ``trust_remote_code`` means)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..files import is_plain_file, write_text
from ..model import ModelArgs
from ..model.hf_format import is_llama

CARD_FILE = "README.md"
DEFAULT_LICENSE = "other"  # the Hub's value for "not stated": a run's licence follows its data and base model
PAPER = "Ladder-residual: parallelism-aware architecture for accelerating large model inference with communication overlapping"
CITATION = """@inproceedings{zhang2025ladder,
  title = {Ladder-residual: parallelism-aware architecture for accelerating large model inference with communication overlapping},
  author = {Zhang, Muru and Mishra, Mayank and others},
  booktitle = {International Conference on Machine Learning (ICML)},
  year = {2025},
  note = {arXiv:2501.06589}
}"""
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, not a local path


@dataclass
class CardFacts:
    """What the card states; None where the export does not know it (the card says so)."""

    name: str
    args: ModelArgs
    dtype: str
    license: str = DEFAULT_LICENSE
    tokenizer: str | None = None
    data: str | None = None  # the training data as the run named it
    data_detail: str = ""  # hub config and split, format
    tokens: int | None = None
    steps: int | None = None
    base_model: str | None = None  # the weights training started from (checkpoint.init_from, or the source)
    frozen_layers: int = 0
    evals: dict[str, dict[str, float]] = field(default_factory=dict)  # task -> metric -> value
    eval_note: str = ""


def source_license(folder: Path) -> str | None:
    """The ``license`` of a model folder's own card (its README.md metadata block), if it states one. Read as
    plain YAML data (``yaml.safe_load``): a card is data."""
    card = folder / CARD_FILE
    if not is_plain_file(card):
        return None
    match = re.match(r"^---\n(.*?)\n---", card.read_text(errors="replace"), re.S)
    try:
        meta = yaml.safe_load(match.group(1)) if match else None
    except yaml.YAMLError:
        return None
    value = meta.get("license") if isinstance(meta, dict) else None
    return value if isinstance(value, str) and value else None


def layout_words(args: ModelArgs) -> str:
    layouts = args.layer_layouts()
    if args.residual == "desync":
        return _desync_words(args)
    n_ladder = layouts.count("ladder")
    if args.residual == "ladder" and n_ladder < args.n_layers:
        return f"hybrid ladder: the last {n_ladder} of {args.n_layers} layers ladder, the first {args.n_layers - n_ladder} standard"
    return {"standard": "standard (a Llama)", "parallel": "parallel attention + MLP", "ladder": "ladder (every layer)"}[
        args.residual
    ]


def _desync_words(args: ModelArgs) -> str:
    """Its TP degree, hybrid split and how many of its modules re-synchronise the ranks' streams."""
    layouts = args.layer_layouts()
    n = layouts.count("desync")
    syncs = sum(a + m for (a, m), layout in zip(args.layer_reduces(), layouts, strict=True) if layout == "desync")
    lower = args.n_layers - n
    hybrid = f"the last {n} of {args.n_layers} layers desync, the first {lower} standard; " if lower else ""
    return (
        f"desync for TP {args.desync_tp}: {hybrid}{args.desync_tp} rank-local residual streams, re-synchronised by "
        f"{syncs} of the desync layers' {2 * n} modules (served at TP {args.desync_tp}, or emulated at TP 1)"
    )


def _metadata(facts: CardFacts) -> str:
    meta = {
        "library_name": "transformers",
        "license": facts.license,
        "pipeline_tag": "text-generation",
        "tags": ["ladder-train", "llama", "text-generation"]
        + ([] if is_llama(facts.args) else ["ladder-residual", "custom_code"]),
    }
    if facts.data and _HUB_ID.match(facts.data):
        meta["datasets"] = [facts.data]
    if facts.base_model and _HUB_ID.match(facts.base_model):
        meta["base_model"] = facts.base_model
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _shape_rows(args: ModelArgs, n_params: int) -> list[tuple[str, str]]:
    return [
        ("layout", layout_words(args)),
        ("parameters", f"{n_params:,}" + (" (embedding tied to the output head)" if args.tie_embeddings else "")),
        ("layers x hidden", f"{args.n_layers} x {args.dim}"),
        ("attention heads / kv heads", f"{args.n_heads} / {args.n_kv_heads}"),
        ("MLP (SwiGLU) hidden", f"{args.ffn_dim}"),
        ("vocabulary / context", f"{args.vocab_size:,} / {args.max_seq_len:,}"),
        ("rope theta", f"{args.rope_theta:g}" + (" (llama3 scaling)" if args.rope_scaling else "")),
    ]


def _training_rows(facts: CardFacts) -> list[tuple[str, str]]:
    unknown = "not recorded in this export"
    rows = [
        ("data", f"{facts.data}{facts.data_detail}" if facts.data else unknown),
        ("tokens seen", f"{facts.tokens:,} in {facts.steps:,} steps" if facts.tokens is not None else unknown),
        ("tokenizer", facts.tokenizer or unknown),
    ]
    if facts.base_model:
        frozen = f"; the first {facts.frozen_layers} layers kept frozen" if facts.frozen_layers else ""
        rows.append(("initialised from", f"{facts.base_model}{frozen}"))
    return rows


def _table(rows: list[tuple[str, str]]) -> str:
    return "| | |\n| --- | --- |\n" + "".join(f"| {key} | {value} |\n" for key, value in rows)


def _eval_section(facts: CardFacts) -> str:
    if not facts.evals:
        return "No evaluation was recorded with this model (ladder-eval or lm-eval can produce one: see below).\n"
    rows = "".join(
        f"| {task} | {metric} | {value:.4g} |\n"
        for task, metrics in facts.evals.items()
        for metric, value in metrics.items()
    )
    return f"{facts.eval_note}\n\n| task | metric | value |\n| --- | --- | --- |\n{rows}"


def _loading_section(path_hint: str, llama: bool) -> str:
    if llama:
        return (
            "Every layer is standard, so this is a plain Llama:\n\n```python\nfrom transformers import "
            f'AutoModelForCausalLM, AutoTokenizer\n\nmodel = AutoModelForCausalLM.from_pretrained("{path_hint}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{path_hint}")\n```\n'
        )
    return (
        "A parallel, ladder or desync model computes another function than a Llama with the same weights, so it has "
        "its own class (`model_type: ladder_llama`). With ladder-train installed, register it with transformers:\n\n"
        "```python\nimport ladder_train.hf\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        "ladder_train.hf.register()  # ladder_llama for AutoConfig / AutoModelForCausalLM\n"
        f'model = AutoModelForCausalLM.from_pretrained("{path_hint}")\n```\n\n'
        "Without ladder-train, `trust_remote_code=True` makes transformers import `configuration_ladder_llama.py` and "
        "`modeling_ladder_llama.py` from this folder and run them as Python with your permissions: read them first "
        "(they import only torch and transformers), and pin a revision when loading from the Hub.\n\n"
        f'```python\nmodel = AutoModelForCausalLM.from_pretrained("{path_hint}", trust_remote_code=True)\n```\n\n'
        f"lm-eval: `lm_eval --model hf --model_args pretrained={path_hint},trust_remote_code=True --tasks ...`\n"
    )


def model_card(facts: CardFacts, n_params: int) -> str:
    llama = is_llama(facts.args)
    kind = "transformer" if llama else "Ladder Residual transformer"
    if facts.args.residual == "desync":
        kind = "desync transformer"
    return (
        f"{_metadata(facts)}\n# {facts.name}\n\n"
        f"A {kind} trained with ladder-train; weights in {facts.dtype}. In a "
        "ladder layer each attention and MLP output joins the residual stream one module late, so under tensor "
        f"parallelism its all-reduce can run while the next module computes (*{PAPER}*, ICML 2025, "
        "arXiv 2501.06589).\n\n"
        f"## Model\n\n{_table(_shape_rows(facts.args, n_params))}\n"
        f"## Training\n\n{_table(_training_rows(facts))}\n"
        f"## Evaluation\n\n{_eval_section(facts)}\n"
        f"## How to load\n\n{_loading_section(facts.name, llama)}\n"
        f"## Licence\n\n`{facts.license}`"
        + (" (not stated: set it with `ladder-export --license`)" if facts.license == DEFAULT_LICENSE else "")
        + f"\n\n## Citation\n\n```bibtex\n{CITATION}\n```\n"
    )


def write_model_card(out_dir: Path, facts: CardFacts, n_params: int) -> Path:
    path = Path(out_dir) / CARD_FILE
    return write_text(path, model_card(facts, n_params))
