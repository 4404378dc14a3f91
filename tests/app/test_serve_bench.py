"""`specgen bench serve`, small: one server on the code pair, four ways of sending the same greedy requests, a
record written, every text equal to plain decoding."""

import json
import subprocess
import sys

from test_serve_support import ROOT


def test_bench_serve_writes_its_record(tmp_path):
    done = subprocess.run([sys.executable, "-m", "specgen", "bench", "serve", "--models", "code", "--method", "draft",
                           "--requests", "4", "--clients", "2", "--max-tokens", "6", "--out-dir", str(tmp_path),
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    ways = result["models"]["code"]["ways"]
    assert set(ways) == {"draft · 1 client", "draft · 2 clients", "ar · 1 client", "ar · 2 clients"}
    assert all(way["identical_to_ar"] and way["completion_tokens"] == 24 for way in ways.values())
    assert result["env"]["load_before"] is not None and result["env"]["command"].startswith("specgen bench serve")
    assert (tmp_path / "serve-latest.md").read_text().count("| draft · 2 clients |") == 1
