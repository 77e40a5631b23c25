"""`vitkit bench` and the compile-friendliness of the model (no graph breaks)."""

import pytest
import torch
import torch._dynamo as dynamo

import vitkit
from vitkit.cli import main
from vitkit.models.bench import bench, report


class FakeClock:
    """time.perf_counter for bench: timed calls of known lengths. Calls come in pairs (start,
    end); the k-th pair is ``lengths[k]`` seconds apart (cycling)."""

    def __init__(self, lengths):
        self.lengths, self.now, self.calls = lengths, 100.0, 0

    def __call__(self):
        if self.calls % 2:
            self.now += self.lengths[(self.calls // 2) % len(self.lengths)]
        self.calls += 1
        return self.now


@pytest.mark.parametrize(("train", "attn", "mode"), [(False, False, "inference"),
                                                     (False, True, "inference+maps"),
                                                     (True, False, "train")])
def test_bench_reports_what_was_timed_and_computed(monkeypatch, train, attn, mode):
    """Independent expectations: the step time is the median of what the clock measured (a
    fake clock: steps of 3, 5 and 4 ms), the matmul peak 2 n^3 over its median, and the
    FLOPs per image what torch's FlopCounterMode counts on the same forward (and backward)
    with attention as explicit matrix products."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    import vitkit.models.bench as bench_module

    monkeypatch.setattr(bench_module.time, "perf_counter", FakeClock([0.003, 0.005, 0.004]))
    r = bench("vit_nano_patch4_32", batch=4, train=train, attn=attn, steps=3, warmup=1)
    assert r.mode == mode and r.step_ms == pytest.approx(4.0) and r.spread > 0
    assert r.images_per_s == pytest.approx(1000.0)  # 4 images in 4 ms
    n = 2048  # the float32 matmul on a CPU, timed 5 times: 3, 5, 4, 3, 5 ms -> median 4
    assert r.peak_gflops == pytest.approx(2 * n**3 / 0.004 / 1e9)
    model = vitkit.create_model("vit_nano_patch4_32")
    model.inplace_inference = False
    x = torch.randn(1, 3, 32, 32)
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        if train:
            torch.nn.functional.cross_entropy(model.train()(x), torch.tensor([0])).backward()
        else:
            with torch.no_grad():
                model.eval()(x, return_attn=attn)
    counted = counter.get_total_flops() / 1e9
    # training is the forward and twice it for the backward (the input's gradient, which
    # nothing needs, is left out by autograd: under 1%)
    assert r.gflops_per_image == pytest.approx(counted, rel=0.01 if train else 1e-9)
    assert r.achieved_gflops == pytest.approx(r.gflops_per_image * 1000.0)
    assert "% of this machine's measured matmul peak" in report(r)


def test_bench_errors_and_cli(capsys):
    with pytest.raises(ValueError, match="dtype must be"):
        bench("vit_nano_patch4_32", dtype="float16")
    with pytest.raises(ValueError, match="drop --train or --attn"):
        bench("vit_nano_patch4_32", train=True, attn=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            bench("vit_nano_patch4_32", device="cuda")
    assert main(["bench", "vit_nano_patch4_32", "--batch", "2", "--steps", "2",
                 "--img-size", "16", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "vit_nano_patch4_32 inference: batch 2, 16x16, bfloat16 on cpu" in out


@pytest.mark.parametrize("maps", [False, True], ids=["default", "maps"])
def test_no_graph_breaks_under_torch_compile(maps):
    model = vitkit.create_model("vit_nano_patch4_32").eval()
    x = torch.randn(2, 3, 32, 32)
    dynamo.reset()
    report = dynamo.explain(lambda t: model(t, return_attn=maps))(x)
    assert report.graph_break_count == 0, report.break_reasons
    assert report.graph_count == 1


def test_gpu_check_script_runs_end_to_end_on_cpu(tmp_path):
    """benchmarks/gpu_check.sh is only run where a GPU is lent: keep it working meanwhile."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "float32", "BATCH": "2", "REPEATS": "1",
           "STEPS": "1", "COMPILE": "", "SIZES": "32", "RESULTS": str(tmp_path),
           "PEER_MODELS": "vit_tiny_patch16_224", "BENCH_MODELS": "vit_nano_patch4_32",
           "PYTHON": sys.executable}
    env.pop("OUT", None)
    run = subprocess.run(["bash", str(root / "benchmarks" / "gpu_check.sh")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    peers = (tmp_path / "gpu_compare_peers.md").read_text()
    assert "## vit_tiny_patch16_224" in peers and "| inference |" in peers
    table = (tmp_path / "gpu_bench.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| vit_nano_patch4_32 ")]
    assert [r.split("|")[3].strip() for r in rows] == ["inference", "training step"]
