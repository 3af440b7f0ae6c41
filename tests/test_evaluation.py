"""The lm-eval adapter, offline tasks, evaluate(), validation loss and ladder-eval, on a tiny random model."""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dataclasses
import functools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance

from ladder_train.cli import ladder_eval as eval_main
from ladder_train.evaluation import EvalError, LadderLM, evaluate, format_table, validation_loss, wandb_summary
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export

TINY = dict(vocab_size=49152, dim=32, n_layers=2, n_heads=2, ffn_dim=64, max_seq_len=128)
TEXT = (
    "The ladder residual adds each module's output to the stream one module late, so that the all-reduce "
    "of tensor parallelism overlaps the next module's computation instead of blocking it."
)


@pytest.fixture
def tokenizer(shared_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(shared_dir / "tokenizers/starcoder/tokenizer.json"))


def tiny_model(seed: int = 0, residual: str = "ladder", **overrides) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(**{**TINY, "residual": residual, **overrides})).eval()


def token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[t+1] | ids[:t+1]) for every t, computed directly from one forward pass."""
    with torch.no_grad():
        logprobs = F.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
    return logprobs[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def requests(kind: str, args_list) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=args, idx=i) for i, args in enumerate(args_list)]


def test_loglikelihood_is_the_sum_of_token_logprobs(tokenizer):
    model = tiny_model()
    lm = LadderLM(model, tokenizer, batch_size=2)
    pairs = [
        ("Question: which layout overlaps communication?\nAnswer:", " the ladder"),
        ("Short", " context, with a longer continuation of several tokens"),
        ("Trailing space moves to the continuation ", "here"),
    ]
    got = lm.loglikelihood(requests("loglikelihood", pairs))
    for (context, continuation), (logprob, _) in zip(pairs, got, strict=True):
        stripped = context.rstrip()
        context_ids = tokenizer.encode(stripped).ids
        full_ids = tokenizer.encode(stripped + context[len(stripped) :] + continuation).ids
        n_cont = len(full_ids) - len(context_ids)
        expected = token_logprobs(model, full_ids)[-n_cont:].sum().item()
        assert logprob == pytest.approx(expected, abs=1e-4)


def test_is_greedy_matches_the_argmax(tokenizer):
    model = tiny_model()
    lm = LadderLM(model, tokenizer)
    context = tokenizer.encode("Residual streams and all-reduce").ids
    with torch.no_grad():
        greedy = int(model(torch.tensor([context]))[0, -1].argmax())
    other = (greedy + 1) % TINY["vocab_size"]
    answers = lm._loglikelihood_tokens([(None, context, [greedy]), (None, context, [other])])
    assert [is_greedy for _, is_greedy in answers] == [True, False]


def test_continuation_longer_than_the_window_is_scored_in_pieces(tokenizer):
    model = tiny_model()
    window = 16
    lm = LadderLM(model, tokenizer, batch_size=2, max_length=window)
    context = tokenizer.encode("Question:").ids
    continuation = tokenizer.encode(TEXT).ids  # more than two windows long
    assert len(continuation) > 2 * window
    ids = context + continuation
    # every continuation token read after at most `window` tokens: the pieces start at 0, 16, 32, ...
    expected = 0.0
    for start in range(0, len(continuation), window):
        end = len(context) + min(start + window, len(continuation))
        piece = ids[max(0, end - window - 1) : end]
        n_new = end - len(context) - start
        expected += token_logprobs(model, piece)[-n_new:].sum().item()
    ((logprob, is_greedy),) = lm._loglikelihood_tokens([(None, context, continuation)])
    assert logprob == pytest.approx(expected, abs=1e-3)
    assert is_greedy is False  # a random model does not recite the text
    # a continuation that fits is unaffected by the splitting
    ((short, _),) = lm._loglikelihood_tokens([(None, context, continuation[:5])])
    assert short == pytest.approx(token_logprobs(model, ids[: len(context) + 5])[-5:].sum().item(), abs=1e-4)


def test_rolling_loglikelihood_matches_the_documented_windows(tokenizer):
    model = tiny_model()
    window = 16
    lm = LadderLM(model, tokenizer, batch_size=3, max_length=window)
    tokens = tokenizer.encode(TEXT).ids
    assert len(tokens) > 2 * window and len(tokens) % window != 0  # several windows, the last one partial
    eot = tokenizer.token_to_id("<|endoftext|>")
    # first window: <|endoftext|> then window-1 tokens, every position scored
    expected = token_logprobs(model, [eot] + tokens[:window]).sum().item()
    predicted = window
    while predicted < len(tokens):
        # each later window: a full context of `window` tokens ending just before its last target
        end = min(predicted + window, len(tokens))
        n_new = end - predicted
        expected += token_logprobs(model, tokens[end - window - 1 : end])[-n_new:].sum().item()
        predicted = end
    (got,) = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(TEXT,)]))
    assert got == pytest.approx(expected, abs=1e-3)


def greedy_reference(model, ids: list[int], steps: int, eot: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence each step (no cache), stopping at <|endoftext|>."""
    out = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            if token == eot:
                break
            out.append(token)
    return out


@functools.cache
def memorised_model(tokenizer_path: str) -> Transformer:
    """A tiny model trained for a few steps on TEXT: greedy decoding then recites the sentence."""
    from tokenizers import Tokenizer

    ids = torch.tensor([[0] + Tokenizer.from_file(tokenizer_path).encode(TEXT).ids])
    model = tiny_model(seed=1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[0, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_generate_until_stops_at_max_gen_toks_and_at_until(tokenizer, shared_dir):
    model = memorised_model(str(shared_dir / "tokenizers/starcoder/tokenizer.json"))
    lm = LadderLM(model, tokenizer, batch_size=4)
    eot = tokenizer.token_to_id("<|endoftext|>")
    prompts = ["The ladder residual", "def ladder(x):", "The ladder residual adds each"]
    answers = lm.generate_until(requests("generate_until", [(p, {"until": [], "max_gen_toks": 7}) for p in prompts]))
    for prompt, answer in zip(prompts, answers, strict=True):
        assert answer == tokenizer.decode(greedy_reference(model, tokenizer.encode(prompt).ids, 7, eot))

    greedy = greedy_reference(model, tokenizer.encode(prompts[0]).ids, 30, eot)
    full = tokenizer.decode(greedy)
    assert full.startswith(" adds each module's output")  # the model recites TEXT
    stop = " output"
    stop_at = next(k for k in range(1, len(greedy) + 1) if stop in tokenizer.decode(greedy[:k]))
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    (answer,) = lm.generate_until(requests("generate_until", [(prompts[0], {"until": [stop], "max_gen_toks": 30})]))
    handle.remove()
    assert answer == " adds each module's"
    assert len(calls) == stop_at  # the prefill gives the first token, one step per later token, none after the stop


def test_vocab_mismatch_is_refused(tokenizer):
    model = tiny_model(vocab_size=1000)
    with pytest.raises(EvalError, match="1000.*49152"):
        LadderLM(model, tokenizer)


@pytest.mark.slow  # lm-eval's environment record runs `python -m pip list`
def test_local_arc_easy_and_piqa_through_simple_evaluate(tokenizer, shared_dir, tmp_path):
    model = tiny_model()
    kwargs = dict(tasks=["arc_easy_local", "piqa_local"], local_data=shared_dir / "eval", limit=5, batch_size=4)
    first = evaluate(model, tokenizer, out_path=tmp_path / "eval/step-10.json", **kwargs)
    second = evaluate(model, tokenizer, out_path=tmp_path / "again.json", **kwargs)
    assert first == second
    for task in ("arc_easy_local", "piqa_local"):
        for metric in ("acc", "acc_norm"):
            assert 0.0 <= first[task][metric] <= 1.0

    # acc recomputed directly: the choice with the highest summed log-probability after "<query>\nAnswer:"
    lm = LadderLM(model, tokenizer)
    rows = [json.loads(line) for line in (shared_dir / "eval/arc_easy.jsonl").read_text().splitlines()[:5]]
    correct = 0
    for row in rows:
        scores = lm.loglikelihood(
            requests("loglikelihood", [(row["query"] + "\nAnswer:", " " + c) for c in row["choices"]])
        )
        correct += max(range(len(scores)), key=lambda i: scores[i][0]) == row["gold"]
    assert first["arc_easy_local"]["acc"] == pytest.approx(correct / len(rows))

    record = json.loads((tmp_path / "eval/step-10.json").read_text())
    assert record["summary"] == json.loads(json.dumps(first))
    assert record["model"]["residual"] == "ladder"
    assert record["lm_eval"]["results"]["piqa_local"]["acc,none"] == pytest.approx(first["piqa_local"]["acc"])
    flat = wandb_summary(first)
    assert flat["eval/arc_easy_local/acc"] == first["arc_easy_local"]["acc"]
    assert len(flat) == sum(len(m) for m in first.values())


@pytest.mark.slow  # lm-eval's environment record runs `python -m pip list`
def test_local_lambada_openbookqa_and_wikitext(tokenizer, shared_dir, monkeypatch):
    import multiprocessing

    def no_fork(*args, **kwargs):  # lm-eval's bootstrap pool: a fork of a threaded trainer can hang (harness.py)
        raise AssertionError("lm-eval forked a multiprocessing pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_fork)
    monkeypatch.delenv("DISABLE_MULTIPROC", raising=False)
    model = tiny_model()
    tasks = ["openbookqa_local", "lambada_local", "wikitext2_local"]
    results = evaluate(model, tokenizer, tasks, local_data=shared_dir / "eval", limit=2, print_table=False)
    assert "DISABLE_MULTIPROC" not in os.environ  # set for the evaluation only
    assert results["lambada_local"]["perplexity_stderr"] > 0  # bootstrapped, in this process
    assert 0.0 <= results["openbookqa_local"]["acc"] <= 1.0
    assert 0.0 <= results["lambada_local"]["acc"] <= 1.0
    assert results["lambada_local"]["perplexity"] > 1.0
    wikitext = results["wikitext2_local"]
    # lm-eval's bits per byte and byte perplexity are two views of one loglikelihood sum
    assert wikitext["byte_perplexity"] == pytest.approx(2 ** wikitext["bits_per_byte"], rel=1e-6)
    assert math.isfinite(wikitext["word_perplexity"]) and wikitext["word_perplexity"] > wikitext["byte_perplexity"]


@pytest.fixture
def arc_as_the_builtin_tasks(monkeypatch):
    """lm-eval's ARC folder stands for its built-in tasks: indexing all of them takes 10-15 s, and these tests are
    about the names and messages, not the index."""
    import lm_eval.tasks
    from lm_eval.tasks import TaskManager

    from ladder_train.evaluation import task_registry

    arc = TaskManager(include_path=str(Path(lm_eval.tasks.__file__).parent / "arc"), include_defaults=False)
    monkeypatch.setattr(task_registry, "builtin_task_manager", lambda: arc)


def test_unknown_task_lists_available_ones(tokenizer, arc_as_the_builtin_tasks):
    with pytest.raises(EvalError, match=r"unknown eval task 'arc_esay'.*arc_easy.*arc_easy_local"):
        evaluate(tiny_model(), tokenizer, ["arc_esay"])


@pytest.mark.slow  # lm-eval's whole task index: 10-15 s
def test_unknown_task_is_named_against_lm_evals_whole_index(tokenizer):
    with pytest.raises(EvalError, match=r"unknown eval task 'hellaswg'; close matches: hellaswag.*lm-eval knows"):
        evaluate(tiny_model(), tokenizer, ["hellaswg"])


def test_local_task_without_local_data_is_refused(tokenizer, tmp_path):
    with pytest.raises(EvalError, match="--local-data"):
        evaluate(tiny_model(), tokenizer, ["piqa_local"])
    with pytest.raises(EvalError, match="piqa.jsonl"):
        evaluate(tiny_model(), tokenizer, ["piqa_local"], local_data=tmp_path)


def test_offline_builtin_task_names_the_local_alternative(tokenizer, monkeypatch, arc_as_the_builtin_tasks):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(EvalError) as info:
        evaluate(tiny_model(), tokenizer, ["arc_easy"], limit=2)
    message = str(info.value)
    assert "\n" not in message
    assert "allenai/ai2_arc" in message and "--include-path" in message and "arc_easy_local" in message


def test_paper_numbers_beside_ours():
    table = format_table({"wikitext": {"word_perplexity": 20.0}}, "1.2B", "ladder")
    assert "18.42" in table and "20.0000" in table
    assert "none for this size/layout" in format_table({"wikitext": {"word_perplexity": 20.0}}, None, "ladder")
    # the deeper ladders have their own rows, and say that they are not throughput-matched
    deeper = format_table({"wikitext": {"word_perplexity": 20.0}}, "4.5B", "ladder")
    assert "14.05" in deeper and "not throughput-matched" in deeper


def test_validation_loss_is_token_weighted_and_restores_train_mode():
    model = tiny_model(vocab_size=97).train()
    torch.manual_seed(1)
    batches = [(torch.randint(0, 97, (b, 8)), torch.randint(0, 97, (b, 8))) for b in (3, 1)]
    batches[1][1][0, :5] = -100  # ignored labels are not counted
    loss, n_tokens = validation_loss(model, batches)
    assert model.training
    assert n_tokens == 3 * 8 + 3
    with torch.no_grad():
        logits = torch.cat([model(x).flatten(0, 1) for x, _ in batches])
    labels = torch.cat([y.flatten() for _, y in batches])
    assert loss == pytest.approx(F.cross_entropy(logits, labels, ignore_index=-100).item(), rel=1e-5)


@pytest.mark.slow  # lm-eval's environment record runs `python -m pip list`
def test_cli_evaluates_an_export_and_refuses_a_tokenizer_mismatch(tokenizer, shared_dir, tmp_path, capsys):
    tokenizer_path = str(shared_dir / "tokenizers/starcoder/tokenizer.json")
    export = save_export(tiny_model(), tmp_path / "export")
    out = tmp_path / "results.json"
    argv = [str(export), "--tasks", "piqa_local", "--local-data", str(shared_dir / "eval"), "--limit", "3"]
    assert eval_main([*argv, "--tokenizer", tokenizer_path, "--out", str(out), "--device", "cpu"]) == 0
    assert 0.0 <= json.loads(out.read_text())["summary"]["piqa_local"]["acc"] <= 1.0
    # held-out perplexity lands in the same results file, beside the task scores of the same invocation
    val = ["--val-data", str(shared_dir / "data/fineweb-edu"), "--val-seq-len", "32", "--val-batches", "2"]
    assert eval_main([*argv, *val, "--tokenizer", tokenizer_path, "--out", str(out), "--device", "cpu"]) == 0
    record = json.loads(out.read_text())
    held_out = record["held_out"]
    assert "piqa_local" in record["summary"] and held_out["tokens"] == 2 * 8 * 32  # 2 batches of 8 windows of 32
    assert held_out["perplexity"] == pytest.approx(math.exp(held_out["loss"]))
    capsys.readouterr()  # drop the progress bars of the runs above

    small = save_export(tiny_model(vocab_size=1000), tmp_path / "small-vocab")
    assert eval_main([str(small), "--tasks", "piqa_local", "--tokenizer", tokenizer_path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vocab_size 1000" in err and "49152" in err

    assert eval_main([str(export), "--tasks", "piqa_local"]) == 2  # no tokenizer.json inside, none given
    assert "--tokenizer" in capsys.readouterr().err


def test_a_chat_models_eos_is_accepted_and_another_models_tokenizer_refused(shared_dir, tmp_path, capsys):
    """Scoring reads the tokenizer's ids and its <|endoftext|>, never the model's eos: an end-of-turn eos (as
    SmolLM2-Instruct's <|im_end|> = 2) scores the same; a tokenizer that is not the model's is still refused."""
    from ladder_train.evaluation.saved_model import open_saved_model

    tokenizer_file = shared_dir / "tokenizers/starcoder/tokenizer.json"

    def export_with(name: str, eos_token_id, eos_token: str | None = None):
        token_ids = {"bos_token_id": 0, "eos_token_id": eos_token_id, "pad_token_id": 0}
        folder = save_export(tiny_model(), tmp_path / name, token_ids=token_ids)
        shutil.copyfile(tokenizer_file, folder / "tokenizer.json")
        if eos_token:
            (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos_token}))
        return folder

    # StarCoder's special <fim_middle> = 2 plays the chat end token; Llama 3.1 lists several ends
    assert open_saved_model(export_with("chat", 2, "<fim_middle>")).config["eos_token_id"] == 2
    assert open_saved_model(export_with("several", [0, 2, 3])).config["eos_token_id"] == [0, 2, 3]
    with pytest.raises(EvalError, match=r"eos_token_id 500, but 500 is 'os' in tokenizer .* not an end token"):
        open_saved_model(export_with("word", 500))
    elsewhere = export_with("elsewhere", 2, "<fim_prefix>")
    with pytest.raises(EvalError, match=r"names '<fim_prefix>', but that token is 1 in it"):
        open_saved_model(elsewhere)
    capsys.readouterr()
    assert eval_main([str(elsewhere), "--tasks", "piqa_local"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ladder-eval: error: tokenizer mismatch: ")


@pytest.mark.slow  # lm-eval's environment record runs `python -m pip list`
def test_user_task_yaml_from_include_path(tokenizer, tmp_path):
    rows = [
        {"q": "Which layout overlaps communication?", "options": ["ladder", "standard"], "answer": i % 2}
        for i in range(4)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_mc.yaml").write_text(
        "task: my_mc\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files: {tmp_path / 'rows.jsonl'}\n"
        "output_type: multiple_choice\ntest_split: train\n"
        'doc_to_text: "{{q}}"\ndoc_to_choice: "{{options}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: acc\n"
    )
    results = evaluate(tiny_model(), tokenizer, ["my_mc"], include_path=tmp_path, print_table=False)
    # the same question every row, so the model picks the same choice each time: right on half of the answers
    assert results["my_mc"]["acc"] == pytest.approx(0.5)


def test_held_out_batches_pack_documents_like_training(tokenizer, tmp_path):
    from ladder_train.evaluation import held_out_batches

    docs = ["first document about ladders", "second one, about residual streams and all-reduce"]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    stream = [t for d in docs for t in tokenizer.encode(d).ids + [tokenizer.token_to_id("<|endoftext|>")]]
    batches = list(held_out_batches(tmp_path / "val.jsonl", tokenizer, seq_len=4, batch_size=2))
    assert len(batches) == len(stream) // 5 // 2
    inputs, labels = batches[0]
    assert inputs.tolist() == [stream[0:4], stream[5:9]]
    assert labels.tolist() == [stream[1:5], stream[6:10]]


@pytest.mark.slow  # lm-eval's environment record runs `python -m pip list`
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_cli_reads_a_training_checkpoint_directly_with_the_numbers_of_its_export(tokenizer, shared_dir, tmp_path):
    from ladder_train.checkpoint import Checkpointer
    from ladder_train.config import load_config
    from ladder_train.export import export_checkpoint

    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    checkpointer = Checkpointer(load_config(None, []).checkpoint, tmp_path / "run", rank=0, world_size=1)
    args = dataclasses.asdict(model.args)
    step = checkpointer.save(3, model, optimizer, {"step": 3, "model_args": args}, {})
    tokenizer_path = str(shared_dir / "tokenizers/starcoder/tokenizer.json")
    argv = ["--tasks", "piqa_local", "--local-data", str(shared_dir / "eval"), "--limit", "3"]
    argv += ["--tokenizer", tokenizer_path, "--device", "cpu"]
    assert eval_main([str(step), *argv]) == 0
    direct = json.loads((tmp_path / "run" / "eval" / "step-3.json").read_text())  # beside the run's evaluations
    export = export_checkpoint(step, tmp_path / "export")
    assert eval_main([str(export), *argv, "--out", str(tmp_path / "exported.json")]) == 0
    exported = json.loads((tmp_path / "exported.json").read_text())
    assert direct["summary"] == exported["summary"] and direct["model"] == exported["model"]
    assert not any(tmp_path.glob("run/checkpoints/step-3/eval"))


def test_bad_held_out_data_is_one_line_naming_it_before_the_model_is_opened(tokenizer, tmp_path, capsys, monkeypatch):
    """An empty file, random bytes named .jsonl, a random .parquet, a bad line past the first: one line each naming
    the file (and line), exit 2. The model folder does not exist: the data is checked before it is opened."""
    from cli_errors import assert_bad_input

    from ladder_train.evaluation import held_out_batches

    noise = np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8).tobytes()
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "noise.jsonl").write_bytes(noise)
    (tmp_path / "noise.parquet").write_bytes(noise)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    nowhere = str(tmp_path / "no-model")
    cases = {
        "empty.jsonl": "empty file",
        "noise.jsonl": "not UTF-8",
        "noise.parquet": "not a parquet file",
        "blank.jsonl": "empty file (no records)",
    }
    for name, why in cases.items():
        assert_bad_input("ladder-eval", [nowhere, "--val-data", str(tmp_path / name)], (name, why), capsys, monkeypatch)
    # a bad record deep in the file, and data too short for one batch: found while reading, still one line
    (tmp_path / "cut.jsonl").write_text(json.dumps({"text": TEXT}) + "\n" + '{"text": "cut\n')
    with pytest.raises(EvalError, match=r"cut\.jsonl: line 2 is not JSON"):
        list(held_out_batches(tmp_path / "cut.jsonl", tokenizer, seq_len=4, batch_size=2))
    (tmp_path / "short.jsonl").write_text(json.dumps({"text": "two words"}) + "\n")
    with pytest.raises(EvalError, match=r"short\.jsonl: too short for one batch of 2 windows of 33 tokens"):
        list(held_out_batches(tmp_path / "short.jsonl", tokenizer, seq_len=32, batch_size=2))
