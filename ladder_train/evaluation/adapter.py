"""``LadderLM``: the lm-eval model adapter over ladder-train's one Transformer.

lm-eval asks for three things, all computed here from the model's fp32 logits:

- ``loglikelihood(context, continuation)``: the summed log-probability of the continuation tokens and
  whether greedy decoding would have produced them. Context/continuation splitting (trailing spaces of the
  context move to the continuation, the pair is tokenized together) is lm-eval's ``TemplateLM`` logic.
- ``loglikelihood_rolling(text)``: the log-probability of a whole text, longer than the context if need be.
  Windowing (lm-eval's ``get_rolling_token_windows`` with ``context_len=1`` made disjoint): the text is
  cut into consecutive windows of ``max_length`` predicted tokens; the first window is conditioned on
  ``<|endoftext|>``, every later one on the single token before it; the last, shorter window keeps a full
  ``max_length`` context. Every token is predicted exactly once.
- ``generate_until(context, {until, max_gen_toks})``: greedy decoding with the model's KV cache, stopped
  at the first ``until`` string, at ``<|endoftext|>`` or after ``max_gen_toks`` tokens.

Requests are sorted by length and scored ``batch_size`` at a time, right-padded with ``<|endoftext|>``
(causal attention: padding after a sequence cannot change its logits). On CUDA the forward runs under
bf16 autocast; on the CPU it stays fp32.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from ..data.tokenizer import eos_id
from ..errors import InputError

DEFAULT_MAX_GEN_TOKS = 256


class EvalError(InputError):
    """Evaluation input that cannot run (task, data, tokenizer). The message is one line naming the culprit."""


class LadderLM(TemplateLM):
    """An ``lm_eval.api.model.LM`` over a plain (unsharded) ``Transformer`` and a ``tokenizers.Tokenizer``."""

    def __init__(self, model, tokenizer, batch_size: int = 8, max_length: int | None = None, device=None):
        super().__init__()
        model_vocab = model.args.vocab_size
        tokenizer_vocab = tokenizer.get_vocab_size()
        if model_vocab != tokenizer_vocab:
            raise EvalError(
                f"tokenizer mismatch: the model's vocab_size is {model_vocab} but the tokenizer has "
                f"{tokenizer_vocab} tokens; evaluate with the tokenizer the model was trained with"
            )
        eot_id = eos_id(tokenizer, where="tokenizer")  # the document separator: scoring's padding and prefix
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        max_length = model.args.max_seq_len if max_length is None else max_length
        if not 1 <= max_length <= model.args.max_seq_len:
            raise ValueError(f"max_length={max_length} must lie in [1, model max_seq_len={model.args.max_seq_len}]")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self._eot_id = eot_id
        self._device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self._device)

    # --- tokenization (TemplateLM's hooks) ---

    @property
    def eot_token_id(self) -> int:
        return self._eot_id

    @property
    def tokenizer_name(self) -> str:
        return "starcoder" if self.tokenizer.get_vocab_size() == 49152 else f"bpe-{self.tokenizer.get_vocab_size()}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # the StarCoder tokenizer adds no special tokens; conditioning on <|endoftext|> is lm-eval's job
        return self.tokenizer.encode(string, add_special_tokens=False).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=False)

    # --- the forward pass ---

    def _autocast(self):
        if self._device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @torch.inference_mode()
    def _logprobs(self, sequences: list[list[int]]) -> torch.Tensor:
        """Log-softmax (fp32) of the model's logits for right-padded ``sequences``: (B, T_max, V)."""
        longest = max(len(s) for s in sequences)
        batch = torch.full((len(sequences), longest), self._eot_id, dtype=torch.long)
        for row, seq in enumerate(sequences):
            batch[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        was_training = self.model.training
        self.model.eval()
        try:
            with self._autocast():
                logits = self.model(batch.to(self._device))
        finally:
            self.model.train(was_training)
        return F.log_softmax(logits.float(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ((context, continuation), context_tokens, continuation_tokens). The model reads the
        last ``max_length`` tokens of context + continuation (minus the final one) and scores the continuation.
        A continuation longer than ``max_length`` is scored in consecutive pieces of ``max_length`` tokens,
        each read after everything before it (truncated on the left to the context window): the summed
        log-probability covers every continuation token, and it is greedy only if every piece is."""
        pieces, owners = [], []
        for index, (_, context, continuation) in enumerate(requests):
            if not continuation:
                raise ValueError("an empty continuation cannot be scored")
            for start in range(0, len(continuation), self.max_length):
                pieces.append((context + continuation[:start], continuation[start : start + self.max_length]))
                owners.append(index)
        scores = self._score_pieces(pieces, disable_tqdm)
        totals = [[0.0, True] for _ in requests]
        for owner, (logprob, is_greedy) in zip(owners, scores, strict=True):
            totals[owner][0] += logprob
            totals[owner][1] = totals[owner][1] and is_greedy
        results = [(total, greedy) for total, greedy in totals]
        for (request, _, _), answer in zip(requests, results, strict=True):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return results

    def _score_pieces(self, pieces: list[tuple[list[int], list[int]]], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """(log-probability, greedy) of each (context, continuation) whose continuation fits the window."""
        # longest first: similar lengths share a batch, and an out-of-memory shows up at once
        collator = Collator(pieces, sort_fn=lambda r: (-len(r[0] + r[1]), tuple(r[0] + r[1])))
        results = []
        progress = tqdm(total=len(pieces), disable=disable_tqdm, desc="loglikelihood")
        for chunk in collator.get_batched(n=self.batch_size):
            inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for ctx, cont in chunk]
            logprobs = self._logprobs(inputs)
            for row, (_, cont) in enumerate(chunk):
                # the continuation's tokens are predicted by the last len(cont) input positions
                end = len(inputs[row])
                cont_logprobs = logprobs[row, end - len(cont) : end]
                targets = torch.tensor(cont, dtype=torch.long, device=cont_logprobs.device)
                total = cont_logprobs.gather(-1, targets[:, None]).sum().item()
                results.append((total, bool((cont_logprobs.argmax(-1) == targets).all())))
                progress.update(1)
        progress.close()
        return collator.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            for context, prediction in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, context, prediction))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm) if windows else []
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, scores, strict=True):
            totals[owner] += logprob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # --- generation ---

    @torch.inference_mode()
    def _greedy(self, prompts: list[list[int]], max_new: int, until: list[str]) -> list[str]:
        """Greedy continuation of equal-length ``prompts`` with the KV cache, each cut at its first stop string."""
        batch = torch.tensor(prompts, dtype=torch.long, device=self._device)
        generated: list[list[int]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        was_training = self.model.training
        self.model.eval()
        self.model.setup_kv_cache(len(prompts), batch.shape[1] + max_new, device=self._device)
        try:
            inputs, position = batch, 0
            for _ in range(max_new):
                with self._autocast():
                    logits = self.model(inputs, start_pos=position)
                position += inputs.shape[1]
                next_tokens = logits[:, -1].float().argmax(-1)
                for row, token in enumerate(next_tokens.tolist()):
                    if done[row]:
                        continue
                    if token == self._eot_id:
                        done[row] = True
                        continue
                    generated[row].append(token)
                    if any(stop in self.tok_decode(generated[row]) for stop in until):
                        done[row] = True
                if all(done):
                    break
                inputs = next_tokens[:, None]
        finally:
            self.model.clear_kv_cache()
            self.model.train(was_training)
        texts = []
        for tokens in generated:
            text = self.tok_decode(tokens)
            for stop in until:
                text = text.split(stop)[0]
            texts.append(text)
        return texts

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        # requests with the same generation settings share batches; within a batch, prompts of equal length
        # decode together (the model has no padding mask, so unequal prompts cannot share a KV cache)
        collator = Collator(
            [req.args for req in requests],
            sort_fn=lambda args: (-len(self.tok_encode(args[0])), args[0]),
            group_fn=lambda args: args[1],
            group_by="gen_kwargs",
        )
        results = []
        progress = tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until")
        for chunk in collator.get_batched(n=self.batch_size):
            contexts, gen_kwargs = zip(*chunk, strict=True)
            kwargs = dict(gen_kwargs[0])
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            until = [stop for stop in until if stop] + [self.tok_decode([self._eot_id])]
            max_new = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            if kwargs.pop("do_sample", False) and kwargs.get("temperature", 0.0) != 0.0:
                raise ValueError("LadderLM.generate_until decodes greedily; do_sample=True is not supported")
            if not 1 <= max_new < self.max_length:
                raise ValueError(f"max_gen_toks={max_new} must lie in [1, max_length={self.max_length})")
            prompts = [
                (self.tok_encode(context) or [self._eot_id])[-(self.max_length - max_new) :] for context in contexts
            ]
            answers: list[str | None] = [None] * len(prompts)
            for length in sorted({len(p) for p in prompts}, reverse=True):
                rows = [i for i, p in enumerate(prompts) if len(p) == length]
                for row, text in zip(rows, self._greedy([prompts[i] for i in rows], max_new, until), strict=True):
                    answers[row] = text
            for args, text in zip(chunk, answers, strict=True):
                self.cache_hook.add_partial("generate_until", args, text)
                results.append(text)
                progress.update(1)
        progress.close()
        return collator.get_original(results)

    def get_model_info(self) -> dict:
        args = self.model.args
        return {"model_residual": args.residual, "model_n_layers": args.n_layers, "model_dim": args.dim}
