"""The GPU's decode step, checked without a GPU: on fake cuda tensors, one compiled-path step neither waits for the
GPU nor copies between host and device; and the KV cache is allocated once per shape and zeroed in place."""

import pytest
import torch
from test_inference import PROMPT, SHAPE, make_model

from ladder_train.inference import Generator
from ladder_train.inference import generate as generate_module
from ladder_train.model import ModelArgs, Transformer

# the GPU's decode step, checked on the CPU: fake cuda tensors --------------------------------------------------
# FakeTensorMode makes cuda tensors without a GPU (shapes and devices, no data). A CPU-only build lacks the cuda
# device guard that Python indexing and Tensor.copy_ take, so FakeCudaIndexing does those with aten ops.


def _aten_index(x: torch.Tensor, index) -> torch.Tensor:
    """``x[index]`` for None, Ellipsis, int, slice and 1-d tensor entries, with aten ops."""
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index):
        at = next(n for n, i in enumerate(index) if i is Ellipsis)
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        index = index[:at] + (slice(None),) * (x.dim() - used) + index[at + 1 :]
    dim = 0
    for i in index:
        if i is None:
            x, dim = x.unsqueeze(dim), dim + 1
        elif isinstance(i, slice):
            start, stop = 0 if i.start is None else i.start, 2**62 if i.stop is None else i.stop
            x, dim = torch.ops.aten.slice(x, dim, start, stop, i.step or 1), dim + 1
        elif isinstance(i, int):
            x = x.select(dim, i)
        elif isinstance(i, torch.Tensor) and i.dim() == 1:
            x, dim = x.index_select(dim, i), dim + 1
        else:
            raise NotImplementedError(f"fake cuda indexing by {i!r}")
    return x


class FakeCudaIndexing(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_cuda = args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cuda"
        if on_cuda and func is torch.Tensor.__getitem__:
            return _aten_index(*args)
        if on_cuda and func is torch.Tensor.__setitem__:
            target, value = _aten_index(args[0], args[1]), args[2]
            return torch.ops.aten.copy_(target, value) if isinstance(value, torch.Tensor) else target.fill_(value)
        if on_cuda and func is torch.Tensor.copy_:
            return torch.ops.aten.copy_(*args, **kwargs)
        return func(*args, **kwargs)


class HostTraffic(torch.utils._python_dispatch.TorchDispatchMode):
    """Records, once ``on``, every op that waits for the GPU or moves data between host and GPU."""

    def __init__(self):
        super().__init__()
        self.on, self.found = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func is torch.ops.aten._local_scalar_dense.default:
            self.found.append(f"{func} (host sync)")  # recorded first: a fake tensor has no value to give
        out = func(*args, **(kwargs or {}))
        if self.on:
            tensors = lambda tree: [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]  # noqa: E731
            inputs = {t.device.type for t in tensors((args, kwargs))}
            outputs = {t.device.type for t in tensors(out)}
            if "cuda" in inputs and "cpu" in outputs:
                self.found.append(f"{func} (device to host)")
            elif "cuda" in outputs and ("cpu" in inputs or func is torch.ops.aten.lift_fresh.default):
                self.found.append(f"{func} (host to device)")
        return out


def fake_cuda_model(residual: str) -> Transformer:
    """A tiny model whose parameters and buffers are fake cuda tensors (call inside FakeTensorMode)."""
    from ladder_train.model.transformer import build_on_meta

    model = build_on_meta(ModelArgs(**SHAPE, residual=residual))
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, tensor in list(store.items()):
                if tensor is not None:
                    fake = torch.empty(tensor.shape, dtype=tensor.dtype, device="cuda")
                    store[name] = torch.nn.Parameter(fake, requires_grad=False) if store is module._parameters else fake
    return model


@pytest.mark.slow  # compiles
@pytest.mark.parametrize("top_k", [None, 5], ids=["greedy", "top_k"])
def test_a_compiled_decode_step_on_cuda_never_waits_for_or_copies_from_the_host(monkeypatch, top_k):
    from torch._subclasses.fake_tensor import FakeTensorMode

    real_generator = torch.Generator
    monkeypatch.setattr(torch, "Generator", lambda device=None: real_generator())  # no cuda generator on a CPU build
    # fake tensors cannot draw from a generator: the draw (a device kernel into the fixed buffer) goes unseeded
    monkeypatch.setattr(generate_module, "exponential_draws", lambda shape, generator, device, out: out.exponential_())
    traffic = HostTraffic()
    # force_eager: the compiled Generator's own code path, with its step functions run eagerly (dynamo cannot
    # trace fake cuda tensors on a CPU build); the prefill's H2D and syncs are not recorded, one decode step is
    with FakeTensorMode(), FakeCudaIndexing(), torch.compiler.set_stance("force_eager"):
        gen = Generator(fake_cuda_model("ladder"), compile=True)
        prompt = torch.zeros(2, 6, dtype=torch.long, device="cuda")
        with traffic:
            tokens = gen.generate(
                prompt,
                2,
                temperature=1.0 if top_k else 0.0,
                top_k=top_k,
                on_prefill_done=lambda: setattr(traffic, "on", True),
            )
    assert tokens.shape == (2, 2) and tokens.device.type == "cuda"
    assert traffic.on and traffic.found == [], traffic.found


def test_the_host_traffic_record_sees_syncs_and_copies():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), FakeCudaIndexing():
        x = torch.zeros(3, device="cuda")
        traffic = HostTraffic()
        with traffic:
            traffic.on = True
            with pytest.raises(Exception, match="_local_scalar_dense"):  # a fake tensor has no value
                x.sum().item()
            x.cpu()
            torch.tensor(7, device="cuda")
            x[1:].add_(1)  # on the device: not recorded
    assert [found.split(" ", 1)[1] for found in traffic.found] == [
        "(host sync)",
        "(device to host)",
        "(host to device)",
    ]


@pytest.mark.parametrize(
    "compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled_path"]
)
def test_the_kv_cache_is_allocated_once_per_shape_and_zeroed_between_generations(compiled):
    """The same cache tensors across generations of one shape (a CUDA graph keeps their addresses), zeroed in
    place: NaN left in them changes nothing. ``compiled_path``: the compiled Generator's code (a device position,
    the whole masked cache read each step, where NaN would spread), its steps run eagerly."""
    model = make_model("ladder", None)
    gen = Generator(model, compile=compiled)
    with torch.compiler.set_stance("force_eager"):
        first = gen.generate(PROMPT, 10)
        caches = [(cache.k, cache.v) for cache in model.kv_caches()]
        for k, v in caches:
            k.fill_(float("nan")), v.fill_(float("nan"))
        again = gen.generate(PROMPT, 10)
        sampled = [gen.generate(PROMPT, 10, temperature=1.0, top_k=5, seed=3) for _ in range(2)]
        assert all(cache.k is k and cache.v is v for cache, (k, v) in zip(model.kv_caches(), caches, strict=True))
        gen.generate(PROMPT[:1], 10)  # another batch size: a cache of its own shape
        assert model.kv_caches()[0].k.shape[0] == 1
    assert torch.equal(again, first) and torch.equal(sampled[1], sampled[0])
    assert torch.equal(first, Generator(make_model("ladder", None)).generate(PROMPT, 10))


def test_decode_on_a_gpu_turns_its_matrix_vector_products_into_tuned_reductions():
    """The decode step's compile options ask inductor for coordinate-descent tuning on a GPU only (never the prefill,
    never the CPU); under it inductor's decompositions rewrite a one-row product (batch-1 decode's linears) on a
    cuda tensor as a multiply and a sum, a Triton reduction it can fuse and tune, where it would call cuBLAS."""
    from torch._inductor import config
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert generate_module.inductor_options(cuda, gemv_tuning=True)["coordinate_descent_tuning"] is True
    assert generate_module.inductor_options(cuda)["coordinate_descent_tuning"] is False  # the prefill's
    assert generate_module.inductor_options(cpu, gemv_tuning=True)["coordinate_descent_tuning"] is False

    def ops(tuning: bool, rows: int) -> set[str]:
        with FakeTensorMode(), config.patch(coordinate_descent_tuning=tuning):
            x = torch.empty(rows, 64, dtype=torch.bfloat16, device="cuda")
            w = torch.empty(192, 64, dtype=torch.bfloat16, device="cuda")
            graph = make_fx(torch.nn.functional.linear, decomposition_table=select_decomp_table())(x, w)
        return {str(node.target).split(".")[1] for node in graph.graph.nodes if node.op == "call_function"}

    assert "mm" not in ops(True, 1) and {"mul", "sum"} <= ops(True, 1)  # decode: a fused reduction
    assert "mm" in ops(False, 1)  # untuned: cuBLAS
    assert "mm" in ops(True, 16)  # a prefill's many rows stay a matrix product
