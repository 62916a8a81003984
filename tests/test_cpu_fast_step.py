"""bench/cpu_mfu.py, the CPU training step's share of torch.mm's peak (issue 41), runs and reports each step."""

from __future__ import annotations


def test_the_cpu_mfu_bench_reports_each_step():
    """bench/cpu_mfu.py on the tiny preset: every step measured, its share of the mm peak and its aten op count."""
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("bench_cpu_mfu", bench / "cpu_mfu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.main(
        ["--preset", "tiny", "--batch_size", "4", "--threads", "1", "--reps", "1", "--mm_size", "64"]
        + ["--optimizers", "fused", "for-loop"]
    )
    assert report["step"] == "fused" and list(report["steps"]) == ["fused", "for-loop"]
    assert all(entry["share_of_mm_peak"] > 0 and entry["aten_ops"] > 0 for entry in report["steps"].values())
