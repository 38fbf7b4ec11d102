"""The GPU-session scripts of ``benchmarks/`` run end to end on the CPU at toy sizes.

A GPU lease is short and rare; a script that broke since the last one would waste it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_targets_runs_on_cpu_and_accounts_for_its_products(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_targets.py"), "mnist", "--device", "cpu",
           "--examples", "3", "--restarts", "2", "--iterations", "1", "--threads", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = tmp_path.glob("gpu_targets_mnist_cpu_*.json")
    r = json.loads(path.read_text())
    assert (r["examples"], r["restarts"], r["iterations"]) == (3, 2, 1)
    assert 0 < r["jvp_seconds"] + r["vjp_seconds"] <= r["seconds"]
    assert 0 < r["jvp_vjp_share"] <= 1
    # Every product a solve needs went through the timed methods (plus the probes of bound()).
    needed = r["products_per_example"] * r["examples"]
    assert r["rows_through_jvp"] + r["rows_through_vjp"] >= needed
    assert np.isfinite(r["bound"]["median"]) and r["bound"]["median"] > 0
    assert "hcrfast.bound:" in proc.stdout


def test_gpu_session_script_parses_and_refuses_unknown_stages(tmp_path):
    script = ROOT / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    proc = subprocess.run(["bash", str(script), "no-such-stage"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path)})
    assert proc.returncode == 2 and "unknown stage 'no-such-stage'" in proc.stderr
