"""CPU-only checks of the benchmark harness (fused_geglu_tools.bench): the GPU-only exit, the cost
model, and the table and plot drawn from a synthetic results JSON (written to tmp_path only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fused_geglu_tools import bench  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cpu_says_gpu_only_and_exits_0(capsys, tmp_path):
    assert bench.main(["--out", str(tmp_path)]) == 0
    assert "GPU only" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())  # nothing pretended


def test_cost_model_matches_anchor_floor():
    # reference/anchors-h200.json: gemma3-1b, M=16 -> floor_fwd_us 11.33 at 4223.34 GB/s (bytes-bound)
    flops, nbytes = bench.cost("geglu_mlp", "fwd", 16, 1152, 6912)
    assert nbytes / (4223.339355647169e9) * 1e6 == pytest.approx(11.3298, rel=1e-4)
    # M=1024: FLOP-bound at 686.6 TFLOP/s -> 71.25 us
    flops, _ = bench.cost("geglu_mlp", "fwd", 1024, 1152, 6912)
    assert flops / 686.6042889303668e12 * 1e6 == pytest.approx(71.2526, rel=1e-4)
    assert bench.cost("geglu_mlp", "train", 1024, 1152, 6912)[0] == 3 * flops


def _synthetic(path: Path) -> Path:
    rows = []
    speed = {"eager": 1.0, "compile": 0.95, "liger": 0.97, "ours-triton": 0.85, "ours-cuda": 0.8}
    for op in ("geglu_mlp", "linear", "geglu"):
        for shape in bench.SHAPES:
            for M in shape.tokens:
                modes = ["fwd", "train"] + (["fwd_graph"] if M <= bench.DECODE_MAX_M else [])
                for prov, f in speed.items():
                    if op == "linear" and prov == "liger":
                        continue
                    for mode in modes:
                        base = 1e-3 * M * shape.H * shape.I / 1e3 * (3 if mode == "train" else 1) + 10
                        ok = not (prov == "ours-cuda" and op == "geglu" and M == 16)
                        rows.append(
                            dict(
                                op=op, shape=shape.name, H=shape.H, I=shape.I, M=M, provider=prov, mode=mode,
                                status="ok" if ok else "FAILED", ok=ok, err=None if ok else "synthetic",
                                median_us=base * f if ok else None, p20_us=None, p80_us=None,
                                frac_of_floor=0.5 if ok else None, peak_mb=100.0 * f * (M / 1024 + 1),
                            )
                        )
    payload = {
        "schema": bench.SCHEMA,
        "created": "2026-01-01T00:00:00+00:00",
        "env": {"device": "Synthetic GPU", "torch": "0.0", "triton": "0.0"},
        "ceilings": {"matmul_tflops": 700.0, "copy_gbps": 4200.0},
        "rows": rows,
        "timing": {"total_s": 1.0, "compile_s": 0.0},
        "json_path": str(path),
    }
    path.write_text(json.dumps(payload))
    return path


def test_plot_from_synthetic_json(tmp_path):
    pytest.importorskip("matplotlib")
    js = _synthetic(tmp_path / "synthetic-2026-01-01.json")
    png = bench.plot(js)
    assert png == js.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_only_cli(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    js = _synthetic(tmp_path / "r.json")
    assert bench.main(["--plot-only", str(js)]) == 0
    assert (tmp_path / "r.png").exists()


def test_plot_only_reads_a_gzipped_results_json(tmp_path):
    """The all-op runs are kept gzipped in benchmarks/results: read_results gives the same payload for
    both forms, and --plot-only draws r2.png (not r2.json.png) beside a gzipped r2.json.gz."""
    import gzip

    js = _synthetic(tmp_path / "r.json")
    gz = tmp_path / "r2.json.gz"
    gz.write_bytes(gzip.compress(js.read_bytes()))
    assert bench.read_results(gz) == bench.read_results(js) == json.loads(js.read_text())
    pytest.importorskip("matplotlib")
    assert bench.main(["--plot-only", str(gz)]) == 0
    assert (tmp_path / "r2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "r2.json.png").exists()


def test_table_ratios(tmp_path):
    payload = json.loads(_synthetic(tmp_path / "t.json").read_text())
    text = bench.table(payload)
    line = next(ln for ln in text.splitlines() if ln.split()[:4] == ["geglu_mlp", "gemma-2b", "1024", "triton"])
    assert "0.85" in line and "0.89" in line  # ours/eager and ours/compile (0.85 / 0.95)
    assert "FAILED" in text


def test_rounds_pool_the_samples_of_every_round(tmp_path, build_dir, monkeypatch):
    """--rounds 3: each timed row is measured three times (round 2 in reverse provider order) and
    its median, p20/p80 and reps come from the pooled samples. The real pipeline runs on CPU
    (tiny float32 shapes, kernel loaded through kernels from build/); only the timer is stubbed."""
    calls = []

    def fake_measure(clock, step, n_sets, st, pre=None):
        calls.append(step)
        value = float(len(calls))  # every call returns different times, so pooling shows
        return [value, value, value], 3

    monkeypatch.setattr(bench, "measure", fake_measure)
    argv = ["--smoke-cpu", "--no-compile", "--no-plot", "--rounds", "3", "--ops", "geglu",
            "--build", str(build_dir), "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["config"]["settings"]["rounds"] == 3
    timed = [r for r in data["rows"] if r["status"] == "ok"]
    assert timed, [r["err"] for r in data["rows"]]
    assert len(calls) == 3 * len(timed)
    for r in timed:
        assert r["reps"] == 9, r
        assert r["p20_us"] < r["median_us"] < r["p80_us"], r  # three different rounds pooled
    # Per (case, mode) with k timed providers the timer saw s1..sk, then sk..s1, then s1..sk again.
    groups: dict[tuple, int] = {}
    for r in timed:
        key = (r["shape"], r["M"], r["mode"])
        groups[key] = groups.get(key, 0) + 1
    assert max(groups.values()) >= 2, "needs two providers in one case to see the order"
    pos = 0
    for key, k in groups.items():
        seg = calls[pos:pos + 3 * k]
        assert len({id(f) for f in seg[:k]}) == k, key
        assert seg[k:2 * k] == seg[:k][::-1], f"{key}: round 2 not in reverse order"
        assert seg[2 * k:] == seg[:k], f"{key}: round 3 not in the first order"
        pos += 3 * k


def test_warmup_and_target_reach_the_timer(tmp_path, build_dir, monkeypatch):
    """--warmup-ms / --target-ms set what every row's measure() gets (and the JSON records), over the
    --smoke-cpu defaults; a non-positive value is refused naming the flag."""
    seen = []

    def fake_measure(clock, step, n_sets, st, pre=None):
        seen.append((st.warmup_ms, st.target_ms))
        return [1.0, 2.0, 3.0], 3

    monkeypatch.setattr(bench, "measure", fake_measure)
    argv = ["--smoke-cpu", "--no-compile", "--no-plot", "--ops", "geglu", "--warmup-ms", "400",
            "--target-ms", "250", "--build", str(build_dir), "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    assert seen and set(seen) == {(400.0, 250.0)}
    settings = json.loads(next(tmp_path.glob("*.json")).read_text())["config"]["settings"]
    assert settings["warmup_ms"] == 400.0 and settings["target_ms"] == 250.0
    for flag in ("--warmup-ms", "--target-ms"):
        with pytest.raises(SystemExit):
            bench.main([flag, "0"])


def test_host_probe_and_pin_cpu_are_recorded(tmp_path, build_dir, monkeypatch, capsys):
    """Every run records the host time of a trivial ATen op at its start and end (the no-graph decode
    rows are host-bound) and prints it under the table; --pin-cpu pins the process to one core and
    says so, and a core it may not use is refused naming the flag."""
    import os

    monkeypatch.setattr(bench, "measure", lambda clock, step, n_sets, st, pre=None: ([1.0, 2.0, 3.0], 3))
    before = os.sched_getaffinity(0)
    core = min(before)
    try:
        argv = ["--smoke-cpu", "--no-compile", "--no-plot", "--ops", "geglu", "--pin-cpu", str(core),
                "--build", str(build_dir), "--out", str(tmp_path)]
        assert bench.main(argv) == 0
        assert os.sched_getaffinity(0) == {core}
    finally:
        os.sched_setaffinity(0, before)
    env = json.loads(next(tmp_path.glob("*.json")).read_text())["env"]
    probe = env["host_probe_us"]
    assert 0 < probe["start"] < 1e4 and 0 < probe["end"] < 1e4, probe
    assert env["pinned"] is True and env["cpu_affinity"] == [core]
    out = capsys.readouterr().out
    assert "host: a trivial ATen op took" in out and f"pinned to CPU [{core}]" in out
    with pytest.raises(SystemExit, match="--pin-cpu"):
        bench.main(["--smoke-cpu", "--pin-cpu", str(1 << 20), "--build", str(build_dir), "--out", str(tmp_path)])
    assert os.sched_getaffinity(0) == before


def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err


def test_gpu_power_log_summarizes_the_samples_inside_a_rows_windows():
    """The harness's clock/power sampler (gpu_power) on a stand-in for nvidia-smi that prints QUERY
    lines: unparseable lines are dropped, and a row's summary covers only the samples inside the
    windows in which it was timed."""
    from fused_geglu_tools import gpu_power

    lines = ["timestamp, clocks.sm [MHz], power.draw [W], clocks_throttle_reasons.active",  # a header
             "2026/01/01 00:00:00.000, 1980, 120.5, 0x0000000000000001",
             "2026/01/01 00:00:01.000, 1605, 699.0, 0x0000000000000004",
             "2026/01/01 00:00:02.000, 1275, 701.2, 0x0000000000000004",
             "2026/01/01 00:00:03.000, [N/A], [N/A], 0x0000000000000000",  # a field the board lacks
             "2026/01/01 00:00:04.000, 1800, 650.0, 0x0000000000000020",
             "2026/01/01 00:00:05.000, 1980, 90.0, 0x0000000000000001"]
    log = gpu_power.PowerLog([sys.executable, "-c", f"print({chr(10).join(lines)!r})"])
    assert log.start()
    log._proc.wait(timeout=60)  # the stand-in prints and exits; stop() would end a real sampler at once
    log.stop()
    assert len(log.samples) == 5
    t = {s.sm_mhz: s.t for s in log.samples}
    windows = [(t[1605] - 0.1, t[1275] + 0.1), (t[1800] - 0.1, t[1800] + 0.1)]
    got = log.summary(windows)
    assert got["samples"] == 3
    assert got["sm_mhz_median"] == 1605 and got["sm_mhz_min"] == 1275
    assert got["watts_max"] == pytest.approx(701.2)
    assert got["power_capped"] == pytest.approx(2 / 3) and got["hw_slowdown"] == pytest.approx(1 / 3)
    assert log.summary([(0.0, 1.0)]) is None  # no sample inside: no made-up numbers


def test_gpu_power_log_without_a_sampler():
    from fused_geglu_tools import gpu_power

    log = gpu_power.PowerLog(["/nonexistent/nvidia-smi"])
    assert not log.start()
    log.stop()  # harmless
    assert log.summary([(0.0, 1e12)]) is None


def test_table_footer_names_each_providers_clock(tmp_path):
    payload = json.loads(_synthetic(tmp_path / "g.json").read_text())
    assert bench.gpu_footer(payload["rows"]) is None  # no sampler: no footer
    for r in payload["rows"]:
        if r["ok"] and r["provider"] in ("eager", "ours-cuda"):
            capped = 1.0 if r["provider"] == "ours-cuda" else 0.0
            r["gpu"] = {"samples": 2, "sm_mhz_median": 1500.0 if capped else 1900.0, "sm_mhz_min": 1400.0,
                        "watts_median": 650.0, "watts_max": 700.0, "power_capped": capped, "hw_slowdown": 0.0}
    n = {p: sum(1 for r in payload["rows"] if r.get("gpu") and r["provider"] == p) for p in ("eager", "ours-cuda")}
    text = bench.table(payload)
    footer = next(ln for ln in text.splitlines() if ln.startswith("SM clock while timed"))
    share = round(100 * n["ours-cuda"] / (n["eager"] + n["ours-cuda"]))  # every sample of ours-cuda capped
    assert "eager 1900" in footer and "ours-cuda 1500" in footer
    assert f"power cap (0x4) in {share}% of {2 * sum(n.values())} samples" in footer


def test_sequence_first_and_addend_linear_rows_run_and_are_checked(tmp_path, build_dir):
    """The sequence-first linear ops (x stored [S, B, K], passed as its [B, S, K] transpose; the down
    projection's K = I, N = H) and the [M, N]-addend op run the real pipeline on CPU: every provider's
    output and grads are checked against float64 before a time is kept; the cost model swaps K and N
    for the down op and counts the addend's M x N."""
    argv = ["--smoke-cpu", "--no-compile", "--no-plot", "--tokens", "16", "--ops", "linear_seqfirst,linear_seqfirst_down,linear_addend",
            "--build", str(build_dir), "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = json.loads(next(tmp_path.glob("*.json")).read_text())["rows"]
    for op in ("linear_seqfirst", "linear_seqfirst_down", "linear_addend"):
        for prov in ("eager", "ours-auto"):
            for mode in ("fwd", "train"):
                got = [r for r in rows if (r["op"], r["provider"], r["mode"]) == (op, prov, mode)]
                assert got and all(r["status"] == "ok" for r in got), (op, prov, mode, [r["err"] for r in got])
    assert bench.seq_first_dims(16) == (8, 2) and bench.seq_first_dims(8192) == (2048, 4)
    up = bench.cost("linear_seqfirst", "fwd", 16, 64, 96)
    down = bench.cost("linear_seqfirst_down", "fwd", 16, 64, 96)
    assert up[0] == down[0] == 2.0 * 16 * 64 * 96
    assert up[1] == (16 * 64 + 96 * 64 + 96 + 16 * 96) * 2 and down[1] == (16 * 96 + 64 * 96 + 64 + 16 * 64) * 2
    assert bench.cost("linear_addend", "fwd", 16, 64, 96)[1] == (16 * 64 + 96 * 64 + 2 * 16 * 96) * 2


def test_tree_dirty_is_judged_against_the_named_commit(tmp_path, monkeypatch):
    """A device copy whose .git holds a stale HEAD: `git status` lists the commits since, but the run
    records the copier's commit, and its tree is that commit's (FUSED_GEGLU_DIRTY=0), as the build says."""
    import subprocess

    for var in ("FUSED_GEGLU_COMMIT", "FUSED_GEGLU_DIRTY"):
        monkeypatch.delenv(var, raising=False)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert bench._tree_dirty(plain) is None  # no git, no flag: unknown
    monkeypatch.setenv("FUSED_GEGLU_DIRTY", "0")
    assert bench._tree_dirty(plain) is False
    monkeypatch.delenv("FUSED_GEGLU_DIRTY")

    repo = tmp_path / "copy"
    repo.mkdir()
    (repo / "f.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "old"], check=True)
    assert bench._tree_dirty(repo) is False
    (repo / "f.py").write_text("x = 2\n")  # the copied tree: a later commit's content
    assert bench._tree_dirty(repo) is True  # judged against its own HEAD
    monkeypatch.setenv("FUSED_GEGLU_COMMIT", "b" * 40)
    monkeypatch.setenv("FUSED_GEGLU_DIRTY", "0")
    assert bench._tree_dirty(repo) is False  # the copier names the commit and vouches for the tree
