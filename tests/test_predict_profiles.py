"""ladder-predict's hardware profiles: the profile file checks and each constant's origin, GPU peaks by exact card,
measured block overheads, the calibration fit, and the --compare arithmetic against ladder-bench's rows."""

import json
import statistics

import pytest

from ladder_train.cli import ladder_predict as predict_main
from ladder_train.predict import compare, paper_check
from ladder_train.predict.calibrate import fit_alpha_beta
from ladder_train.predict.hardware import Device, Link, load_profiles, parse_profiles
from ladder_train.predict.perfmodel import InputError, module_kernels, predict_rows, roofline_s
from ladder_train.predict.shapes import resolve_shape


def test_shipped_profiles_load():
    devices = load_profiles()
    assert {"h100", "h200", "a100", "cpu"} <= set(devices)
    h100 = devices["h100"]
    assert h100.peak_flops == pytest.approx(989.4e12) and h100.mem_bw == pytest.approx(3.35e12)
    assert {"nvlink", "pcie", "ib"} <= set(h100.links)


def test_bad_profile_key_is_one_line_naming_file_and_key(tmp_path, capsys):
    bad = tmp_path / "mine.yaml"
    bad.write_text("gpu9:\n  peak_tflop: 10\n")
    with pytest.raises(InputError) as err:
        load_profiles(bad)
    assert str(err.value) == f"{bad}: gpu9.peak_tflop: unknown key (known: " + str(err.value).split("(known: ")[1]
    bad.write_text("gpu9:\n  peak_tflops: -1\n")
    with pytest.raises(InputError, match=r"mine.yaml: gpu9.peak_tflops must be a positive number, got -1"):
        load_profiles(bad)
    good = yaml_profile(links="    fast: {alpha_us: 5, busbw_gbs: 10, algorithm: tree}\n")
    with pytest.raises(InputError, match=r"x.yaml: g.links.fast.algorithm must be one of ring"):
        parse_profiles(__import__("yaml").safe_load(good), "x.yaml")
    # through the CLI: one line, before any work
    assert predict_main(["--profile", str(bad), "--gpu", "gpu9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ladder-predict: error: {bad}: gpu9.peak_tflops") and err.count("\n") == 1


def yaml_profile(links: str) -> str:
    return (
        "g:\n  peak_tflops: 1\n  mem_bw_gbs: 10\n  compute_eff: 1\n  mem_eff: 1\n  kernel_us: 1\n"
        "  dtype_bytes: 4\n  compiled: false\n  links:\n" + links
    )


CPU = Device(
    "cpu",
    peak_flops=50e9,
    mem_bw=10e9,
    compute_eff=1.0,
    mem_eff=1.0,
    kernel_s=5e-6,
    dtype_bytes=4,
    compiled=False,
    links={"gloo": Link("gloo", 500e-6, 1e9, interference=0.2)},
    gpus_per_node=2,
)


def bench_row(layout, decode_ms, speedup, none_ms, x=6.0):
    args = {
        "vocab_size": 512,
        "dim": 256,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 4,
        "ffn_dim": 512,
        "max_seq_len": 64,
        "residual": layout,
        "ladder_layers": None,
    }
    return {
        "model": "tiny",
        "shape": "L2-d256-h4-f512-v512",
        "model_args": args,
        "layout": layout,
        "batch": 1,
        "prompt_len": 8,
        "gen_len": 8,
        "prefill_ms": 50.0,
        "decode_ms_per_token": decode_ms,
        "tokens_per_s": 10.0,
        "none": {"decode_ms_per_token": none_ms},
        "tp": 2,
        "dtype": "float32",
        "compiled": False,
        "emulated_link_latency_ms": x,
        "decode_speedup_vs_standard": speedup,
    }


def test_compare_arithmetic(tmp_path):
    rows = [bench_row("standard", 40.0, 1.0, 10.0), bench_row("ladder", 20.0, 2.0, 10.0)]
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results, summary = compare.compare_with_bench(compare.bench_rows(str(path)), CPU)
    shape = compare.shape_from_fields("L2-d256-h4-f512-v512", rows[0]["model_args"], True, "t")
    from ladder_train.predict.perfmodel import Emulated

    pred = {r["layout"]: r for r in predict_rows(shape, CPU, "gloo", 2, [1], 8, 8, Emulated(6e-3))}
    std, lad = results
    assert std["pred_decode_ms"] == pred["standard"]["decode_ms_per_token"]
    assert std["decode_err"] == pytest.approx(pred["standard"]["decode_ms_per_token"] / 40.0 - 1)
    assert lad["decode_err"] == pytest.approx(pred["ladder"]["decode_ms_per_token"] / 20.0 - 1)
    assert lad["speedup_err"] == pytest.approx(pred["ladder"]["decode_speedup_vs_standard"] / 2.0 - 1)
    assert std["speedup_err"] is None  # standard's speedup is 1 by definition
    assert summary["decode"] == pytest.approx((abs(std["decode_err"]) + abs(lad["decode_err"])) / 2)
    assert summary["speedup"] == pytest.approx(abs(lad["speedup_err"]))
    assert summary["none"] == pytest.approx(statistics.fmean([abs(std["none_err"]), abs(lad["none_err"])]))
    # X = 6 ms per all-reduce, far above this model's compute: the one serialised link carries 4 of them a
    # step, so even the ladder takes more than 24 ms; standard adds its compute on top
    assert pred["standard"]["decode_ms_per_token"] > pred["ladder"]["decode_ms_per_token"] > 24


def test_compare_without_model_args_is_one_line(tmp_path, capsys):
    row = bench_row("standard", 40.0, 1.0, 10.0)
    del row["model_args"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert predict_main(["--compare", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"ladder-predict: error: {path}:1: no model_args in the row: rerun ladder-bench with a version that records them\n"
    )


def test_calibration_fit_recovers_alpha_and_bandwidth():
    sizes = [1e3, 1e4, 1e5, 1e6, 4e6]
    alpha, busbw = fit_alpha_beta(sizes, [300e-6 + s / 2e9 for s in sizes], tp=2)
    assert alpha == pytest.approx(300e-6) and busbw == pytest.approx(2e9)


# -- where each constant comes from ---------------------------------------------------------------------------


def test_every_shipped_constant_says_its_origin():
    from ladder_train.predict.hardware import ORIGIN_NEEDED, _shipped_data, origins

    said = origins()
    for name, entry in _shipped_data().items():
        needed = [k for k in (*ORIGIN_NEEDED["device"], "card") if k in entry]
        needed += [f"links.{ln}.{k}" for ln, link in entry["links"].items() for k in ORIGIN_NEEDED["link"] if k in link]
        assert [k for k in needed if k not in said[name]] == [], name
    # the out-of-sample check fits the hand-set constants and holds the rest fixed: the fitted ones say so, the
    # fixed ones are public figures
    h100 = said["h100"]
    for keys in paper_check.FREE_KEYS.values():
        assert all(
            h100[k].startswith("fitted: set by hand with the paper's 70B table")
            or h100[k].startswith("fitted: nvlink's value")
            for k in keys
        ), keys
    assert all(h100[k].split(":")[0] in ("spec", "measured") for k in paper_check.FIXED_KEYS)
    assert said["cpu"]["links.gloo.alpha_us"].startswith("fitted: ")  # the calibration's alpha-beta fit


def test_origin_entries_are_checked_and_do_not_change_a_prediction(tmp_path):
    link = "    fast: {alpha_us: 5, busbw_gbs: 10, origin: {alpha_us: 'measured: here'}}\n"
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml_profile(link) + "  origin: {mem_bw_gbs: 'spec: a datasheet', kernel_us: 'assumed: 1'}\n")
    with_origin = load_profiles(mine)["g"]
    mine.write_text(yaml_profile("    fast: {alpha_us: 5, busbw_gbs: 10}\n"))
    assert with_origin == load_profiles(mine)["g"]
    mine.write_text(yaml_profile(link) + "  origin: {mem_bw_gbs: 'from a blog'}\n")
    with pytest.raises(InputError, match=r"mine.yaml: g.origin.mem_bw_gbs must be 'KIND: where from', KIND one of"):
        load_profiles(mine)
    mine.write_text(yaml_profile(link) + "  origin: {mem_bw: 'spec: x'}\n")
    with pytest.raises(InputError, match=r"mine.yaml: g.origin.mem_bw: names no constant of this entry"):
        load_profiles(mine)
    mine.write_text(yaml_profile("    fast: {alpha_us: 5, busbw_gbs: 10, origin: {busbw: 'spec: x'}}\n"))
    with pytest.raises(InputError, match=r"mine.yaml: g.links.fast.origin.busbw: names no constant"):
        load_profiles(mine)


def test_a_calibrated_profile_says_its_origins(tmp_path):
    from ladder_train.predict.calibrate import SIZES, profile_yaml
    from ladder_train.predict.hardware import origins

    m = {
        "matmul_flops": 5e10,
        "gemv_bytes_s": 1e10,
        "op_s": 1e-5,
        "attention_s": 5e-4,
        "mlp_s": 1e-4,
        "step_s": 0.0,
        "allreduce_s": [5e-4 + s / 1e9 for s in SIZES],
        "interference": 0.2,
        "overlap_raw": {"allreduce_1mb_s": 2e-3, "work_alone_s": 1e-2, "work_with_allreduce_s": 1.1e-2},
    }
    path = tmp_path / "cpu.yaml"
    path.write_text(profile_yaml(m))
    said = origins(path)["cpu"]
    assert said["peak_tflops"].startswith("measured: ladder-predict calibrate")
    assert said["links.gloo.busbw_gbs"].startswith("fitted: ") and said["links.gloo.interference"].startswith(
        "measured"
    )


def test_measured_block_overheads_replace_kernel_counts(tmp_path):
    import dataclasses

    from ladder_train.predict.perfmodel import module_times

    shape = resolve_shape("small")
    ks = module_kernels(shape, CPU, 2, 1, 1, 16)
    plain = module_times(ks, CPU)
    assert plain["mlp"] == pytest.approx(roofline_s(ks["mlp"], CPU))
    measured = dataclasses.replace(CPU, overheads={"attention": 1e-3, "mlp": 2e-4, "step": 5e-4})
    times = module_times(ks, measured)
    assert times["attention"] == pytest.approx(roofline_s(ks["attention"], CPU, fixed=False) + 1e-3)
    assert times["head"] == pytest.approx(roofline_s(ks["head"], CPU, fixed=False) + 5e-4)
    bad = tmp_path / "half.yaml"
    bad.write_text(yaml_profile("    gloo: {alpha_us: 5, busbw_gbs: 1}\n") + "  attention_overhead_us: 100\n")
    with pytest.raises(
        InputError, match=r"half.yaml: g.mlp_overhead_us: missing \(the three \*_overhead_us keys go together\)"
    ):
        load_profiles(bad)


# GPU peaks by exact card: the one table (gpu_cards.py) that the profiles and the trainer's MFU read.
# Dense bf16 = the datasheets' with-sparsity figures halved (H100: 1,979 / 1,513 / 1,671 TF for SXM / PCIe / NVL).
@pytest.mark.parametrize(
    "device_name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),  # SXM5, as torch.cuda.get_device_name() names it
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H200 NVL", 835e12),  # the longer match beats "H200"
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A100-PCIE-40GB", 312e12),
        ("nvidia h100 pcie", 756e12),  # case-insensitive
    ],
)
def test_peak_flops_by_exact_card(device_name, peak):
    from ladder_train.gpu_cards import peak_flops_for

    assert peak_flops_for(device_name) == pytest.approx(peak, rel=1e-12)


@pytest.mark.parametrize("device_name", ["NVIDIA H100", "NVIDIA A10", "Tesla V100-SXM2-16GB", "NVIDIA L40S", ""])
def test_unknown_card_has_no_peak_rather_than_another_cards(device_name):
    from ladder_train.gpu_cards import peak_flops_for

    assert peak_flops_for(device_name) is None


def test_gpu_profiles_take_their_peak_from_the_card_table(tmp_path):
    from ladder_train.gpu_cards import CARDS

    assert all(card.source and card.match for card in CARDS.values())  # every figure names its source
    devices = load_profiles()
    assert devices["h100"].peak_flops == CARDS["h100_sxm"].peak_flops == pytest.approx(989.4e12)
    assert devices["h200"].peak_flops == CARDS["h200"].peak_flops
    assert devices["a100"].peak_flops == CARDS["a100"].peak_flops == pytest.approx(312e12)
    mine, link = tmp_path / "mine.yaml", "    fast: {alpha_us: 5, busbw_gbs: 10}\n"
    mine.write_text(yaml_profile(link).replace("peak_tflops: 1", "card: h100_pcie"))
    assert load_profiles(mine)["g"].peak_flops == pytest.approx(756e12)
    mine.write_text(yaml_profile(link) + "  card: h100_nvl\n")
    with pytest.raises(InputError, match=r"mine.yaml: g.peak_tflops: give either peak_tflops or card"):
        load_profiles(mine)
    mine.write_text(yaml_profile(link).replace("peak_tflops: 1", "card: b200"))
    with pytest.raises(InputError, match=r"mine.yaml: g.card: unknown card 'b200' \(known: h100_sxm, "):
        load_profiles(mine)
