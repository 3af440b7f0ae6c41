"""ladder-generate (``ladder_train/completion.py``) and the Generator's stop at end-of-sequence: rows finish at their
stop token and the loop ends when all have (none by default, as the benchmark needs); the stop token is read from
the model folder; the command gives the same completion from an export, a training checkpoint and under torchrun;
bad input is one line, exit 2, before any weights are read; and SmolLM2 at TP = 3 and 1 gives transformers' logits
and greedy tokens."""

import dataclasses
import json

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks, torchrun

from ladder_train.checkpoint import Checkpointer
from ladder_train.cli import ladder_generate as generate_main
from ladder_train.config import load_config, save_config
from ladder_train.data import stop_tokens
from ladder_train.data.tokenizer import byte_tokenizer, model_tokenizer
from ladder_train.inference import Generator, TPCommunicator, load_tp_model
from ladder_train.model import ModelArgs, Transformer
from ladder_train.model.hf_format import save_export

# ladder-generate --------------------------------------------------------------------------------------------

BYTE_SHAPE = dict(vocab_size=257, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=48)  # byte vocab
CODE_PROMPT = "def add(a, b):"  # 14 byte tokens
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
)


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**BYTE_SHAPE)).eval()
    with torch.no_grad():  # wider weights than the init's, whose greedy tokens repeat one byte: varied tokens
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.5)
    return model


def tiny_folder(path, tokenizer_config: dict | None = None):
    """An export of ``tiny_model`` with the byte tokenizer, and optionally a tokenizer_config.json."""
    save_export(tiny_model(), path)
    byte_tokenizer().save(str(path / "tokenizer.json"))
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return path


def expected_completion(prompt_ids: list[int], max_new: int, stop: int = 0) -> str:
    """What ladder-generate should print for the tiny model: its greedy tokens up to the stop token, as text."""
    new = Generator(tiny_model(), None).generate(torch.tensor([prompt_ids]), max_new, stop_tokens=[stop])[0].tolist()
    return byte_tokenizer().decode(new[: new.index(stop)] if stop in new else new)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    status = generate_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


# the Generator's stop ---------------------------------------------------------------------------------------


def test_rows_stop_at_their_stop_token_and_the_loop_when_all_have():
    tokenizer = byte_tokenizer()
    prompts = torch.tensor([tokenizer.encode(CODE_PROMPT).ids, tokenizer.encode("class Ladder()").ids])
    generator = Generator(tiny_model(), None)
    free = generator.generate(prompts, 20)  # the benchmark's use: no stop token, always max_new_tokens
    assert free.shape == (2, 20)
    rows = free.tolist()

    def first(row: int, stop: int) -> int | None:
        return rows[row].index(stop) if stop in rows[row] else None

    def expected(row: int, stop: int, length: int) -> list[int]:
        """The free row up to its first stop token, then that token repeated."""
        cut = first(row, stop) + 1 if first(row, stop) is not None else 20
        return (rows[row][:cut] + [stop] * 20)[:length]

    # a token only row 0 produces: row 0 finishes, row 1 runs to max_new_tokens
    only_first = next(t for t in rows[0][1:] if t not in rows[1] and rows[0].index(t) > 0)
    out = generator.generate(prompts, 20, stop_tokens=[only_first])
    assert out.shape == (2, 20) and 0 < first(0, only_first) < 19
    assert out.tolist() == [expected(0, only_first, 20), expected(1, only_first, 20)]
    # a token both produce: the loop ends once the later of the two has it
    both = next(t for t in rows[0] if t in rows[1])
    length = max(first(0, both), first(1, both)) + 1
    assert length < 20 and first(0, both) != first(1, both)  # observed: they finish at different steps
    out = generator.generate(prompts, 20, stop_tokens=[both])
    assert out.tolist() == [expected(0, both, length), expected(1, both, length)]
    # one row ends right after its stop token; with several stop ids, at whichever comes first
    assert (
        generator.generate(prompts[:1], 20, stop_tokens=[only_first])[0].tolist() == rows[0][: first(0, only_first) + 1]
    )
    stops = [rows[0][5], rows[0][3]]
    end = min(first(0, t) for t in stops) + 1
    assert end == 4 and generator.generate(prompts[:1], 20, stop_tokens=stops)[0].tolist() == rows[0][:end]


def test_the_stop_token_comes_from_the_model_folder(tmp_path):
    tokenizer = byte_tokenizer()
    folder = tmp_path / "m"
    folder.mkdir()
    # nothing in the folder: <|endoftext|>, which every tokenizer here has
    assert stop_tokens(folder, tokenizer, 257) == ([0], "<|endoftext|> (in the vocabulary)")
    (folder / "config.json").write_text(json.dumps({"eos_token_id": 66}))  # byte 'A' + 1
    assert stop_tokens(folder, tokenizer, 257) == ([66], "A (eos_token_id of config.json)")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [11, 14]}))  # "\n" and "\r"
    assert stop_tokens(folder, tokenizer, 257)[0] == [11, 14]
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "B", "special": True}}))
    assert stop_tokens(folder, tokenizer, 257) == ([67], "B (eos_token of tokenizer_config.json)")


def test_the_tokenizer_is_the_flag_the_folders_or_the_runs(tmp_path):
    folder = tiny_folder(tmp_path / "export")
    assert model_tokenizer(folder)[1] == str(folder / "tokenizer.json")
    assert model_tokenizer(folder, "byte")[1] == "byte"
    step = tmp_path / "run" / "checkpoints" / "step-1"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    save_config(load_config(None, ["data.tokenizer=byte"]), tmp_path / "run" / "config.yaml")
    tokenizer, name = model_tokenizer(step)
    assert name == "byte" and tokenizer.get_vocab_size() == 257


# the command -------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the checkpoint saved in one process
def test_an_export_and_a_checkpoint_of_one_model_complete_alike(tmp_path, capsys):
    model = tiny_model()
    export = tiny_folder(tmp_path / "export")
    cfg = load_config(None, ["checkpoint.async_save=false", "data.tokenizer=byte"])
    save_config(cfg, tmp_path / "run" / "config.yaml")  # the run's tokenizer is what the checkpoint gets
    checkpointer = Checkpointer(cfg.checkpoint, tmp_path / "run", rank=0, world_size=1)
    optimizer = torch.optim.AdamW(model.parameters())
    step = checkpointer.save(3, model, optimizer, {"model_args": dataclasses.asdict(model.args)}, {})

    expected = expected_completion(byte_tokenizer().encode(CODE_PROMPT).ids, 20)
    assert expected  # the random model says something before <|endoftext|>
    for source in (export, step):
        status, out, err = run_cli(capsys, source, "--prompt", CODE_PROMPT, "--max-new-tokens", 20)
        assert (status, out) == (0, expected + "\n")
        assert "ladder-generate: 20 new tokens" in err and "at TP 1; --max-new-tokens 20 reached" in err


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_checkpoint_of_an_adapted_model_keeps_its_chat_template(tmp_path, capsys):
    """A run that took its tokenizer from a model folder (checkpoint.init_from's): --chat on its checkpoint uses
    that folder's template and eos, and ladder-export carries the template into the export."""
    from ladder_train.export import export_checkpoint

    model = tiny_model()
    prompt = byte_tokenizer().encode("<user>hi<a>").ids
    free = Generator(tiny_model(), None).generate(torch.tensor([prompt]), 24)[0].tolist()
    stop = next(t for i, t in enumerate(free) if i >= 3 and t not in free[:i])  # a token it does produce
    eos = byte_tokenizer().id_to_token(stop)
    pretrained = tiny_folder(tmp_path / "pretrained", {"chat_template": CHAT_TEMPLATE, "eos_token": eos})
    cfg = load_config(None, ["checkpoint.async_save=false", f"data.tokenizer={pretrained / 'tokenizer.json'}"])
    save_config(cfg, tmp_path / "run" / "config.yaml")
    checkpointer = Checkpointer(cfg.checkpoint, tmp_path / "run", rank=0, world_size=1)
    step = checkpointer.save(3, model, torch.optim.AdamW(model.parameters()), {"model_args": BYTE_SHAPE}, {})
    export = export_checkpoint(step, tmp_path / "export")
    assert (export / "tokenizer_config.json").read_text() == (pretrained / "tokenizer_config.json").read_text()
    expected = expected_completion(prompt, 24, stop=stop)
    assert len(byte_tokenizer().encode(expected).ids) < 24
    for source in (step, export):
        status, out, err = run_cli(capsys, source, "--chat", "--prompt", "hi", "--max-new-tokens", 24)
        assert (status, out) == (0, expected + "\n") and f"{eos} (eos_token of tokenizer_config.json)" in err, err


def test_chat_template_wraps_the_prompt(tmp_path, capsys):
    folder = tiny_folder(tmp_path / "m", {"chat_template": CHAT_TEMPLATE, "eos_token": "<|endoftext|>"})
    status, out, _ = run_cli(capsys, folder, "--chat", "--prompt", "hi", "--max-new-tokens", 8)
    assert status == 0 and out == expected_completion(byte_tokenizer().encode("<user>hi<a>").ids, 8) + "\n"


def test_sampling_is_seeded(tmp_path, capsys):
    folder = tiny_folder(tmp_path / "m")
    args = [folder, "--prompt", CODE_PROMPT, "--max-new-tokens", 12, "--temperature", 5.0, "--top-k", 100]
    outs = [run_cli(capsys, *args, "--seed", seed)[1] for seed in (1, 1, 2)]
    assert outs[0] == outs[1] != outs[2]
    assert outs[0] != run_cli(capsys, folder, "--prompt", CODE_PROMPT, "--max-new-tokens", 12)[1]  # not the greedy one


@pytest.mark.parametrize(
    "argv, message",
    [
        (["{tmp}/missing", "--prompt", "x"], "'{tmp}/missing' is neither a model preset"),
        (["tiny", "--prompt", "x"], "'tiny' is a preset (random weights, no tokenizer)"),
        (["{export}", "--prompt", "x"], "{export}: no tokenizer.json inside; pass --tokenizer"),
        (["{folder}", "--prompt", "x", "--chat"], "{folder}/tokenizer_config.json: not found"),
        (["{folder}", "--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
        (["{folder}", "--prompt", "x", "--temperature", "-1"], "--temperature must be 0 (greedy) or positive"),
        (["{folder}", "--prompt", "x", "--top-k", "5"], "--top-k 5: needs --temperature > 0"),
        (["{folder}", "--prompt", ""], "--prompt is empty"),
        (["{folder}", "--prompt", "x" * 48], "the prompt is 48 tokens, the model's max_seq_len is 48: no room"),
        (["{folder}", "--prompt", "x" * 40], "the prompt (40 tokens) + max_new_tokens=64 exceed the model's"),
        (["{folder}", "--prompt", "x", "--tokenizer", "{tmp}/nope.json"], "--tokenizer: no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_loading(tmp_path, capsys, monkeypatch, argv, message):
    folder = tiny_folder(tmp_path / "folder")
    save_export(tiny_model(), tmp_path / "export")  # no tokenizer.json

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr("ladder_train.completion.load_tp_model", no_loading)  # the name ladder-generate calls
    paths = dict(tmp=tmp_path, folder=folder, export=tmp_path / "export")
    status, out, err = run_cli(capsys, *[a.format(**paths) for a in argv])
    lines = [line for line in err.splitlines() if not line.startswith("data: tokenizer")]  # a logged note
    assert status == 2 and out == ""
    assert len(lines) == 1 and lines[0].startswith(f"ladder-generate: error: {message.format(**paths)}"), err


@pytest.mark.slow
def test_torchrun_tp2_prints_the_single_process_completion_once(tmp_path, capsys):
    folder = tiny_folder(tmp_path / "m", {"eos_token": "<|endoftext|>"})
    args = [str(folder), "--prompt", CODE_PROMPT, "--max-new-tokens", "16"]
    expected = run_cli(capsys, *args)[1]
    result = torchrun(2, "-m", "ladder_train.inference", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected  # rank 0 alone prints
    assert "at TP 2" in result.stderr and "RuntimeWarning" not in result.stderr


# a real pretrained model: SmolLM2-135M-Instruct ------------------------------------------------------------------

SMOLLM2_TEXT = "The three primary colors are"
SMOLLM2_NEW_TOKENS = 32


@pytest.mark.slow
def test_smollm2_chat_answers_paris_and_stops_at_its_eos(smollm2, capsys):
    status, out, err = run_cli(
        capsys, smollm2, "--chat", "--prompt", "What is the capital of France?", "--max-new-tokens", 12
    )
    assert status == 0 and "Paris" in out
    # observed: the whole answer, then <|im_end|> as the 8th token, before the 12 allowed
    assert out == "The capital of France is Paris.\n"
    assert "8 new tokens" in err and "stopped at <|im_end|> (eos_token of tokenizer_config.json)" in err


@pytest.fixture(scope="module")
def smollm2_reference(smollm2):
    """transformers' logits over the prompt and its greedy 32 new tokens (stopping at eos, as it does)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    ids = torch.tensor([Tokenizer.from_file(str(smollm2 / "tokenizer.json")).encode(SMOLLM2_TEXT).ids])
    model = transformers.LlamaForCausalLM.from_pretrained(smollm2).float().eval()
    with torch.no_grad():
        logits = model(ids).logits
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=SMOLLM2_NEW_TOKENS, pad_token_id=2
        )
    return ids, logits, out[0, ids.shape[1] :]


def _smollm2_rank(folder, ids, out, distributed: bool):
    rank, world, group = 0, 1, None
    if distributed:  # a rank of run_ranks
        dist.init_process_group("gloo")
        rank, world, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    model = load_tp_model(folder, tp_rank=rank, tp_size=world, group=group)
    if group is not None:
        model.set_communicator(TPCommunicator("sync", group))
    with torch.no_grad():
        logits = model(ids)
    tokens = Generator(model, group).generate(ids, SMOLLM2_NEW_TOKENS, stop_tokens=[2])[0]  # eos_token_id 2: <|im_end|>
    attention = model.layers[0].attention
    rows = (attention.wq.weight.shape[0], attention.wk.weight.shape[0])
    torch.save({"logits": logits, "tokens": tokens, "rows": rows}, out / f"{rank}.pt")
    if group is not None:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("tp", [3, 1])
def test_smollm2_at_tp_gives_transformers_logits_and_greedy_tokens(smollm2, smollm2_reference, tmp_path, tp):
    ids, expected_logits, expected_tokens = smollm2_reference
    assert expected_tokens.shape == (SMOLLM2_NEW_TOKENS,)  # observed: no eos within 32 tokens of this prompt
    if tp == 1:
        _smollm2_rank(smollm2, ids, tmp_path, distributed=False)
    else:  # 9 heads and 3 kv heads: 3 and 1 per rank
        run_ranks(_smollm2_rank, tp, smollm2, ids, tmp_path, True)
    for rank in range(tp):
        result = torch.load(tmp_path / f"{rank}.pt")
        assert result["rows"] == (9 // tp * 64, 3 // tp * 64)  # this rank's heads and kv heads of 64
        relative = (result["logits"] - expected_logits).abs().max() / expected_logits.abs().max()
        assert relative < 1e-4, relative
        assert result["tokens"].tolist() == expected_tokens.tolist()
