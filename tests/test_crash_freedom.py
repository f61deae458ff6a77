"""Issue 14 #12: no crash on a real corpus (a sample of the installed torch package's sources, the
whole of it in bench/crash_corpus.py) and on generated modules (hypothesis + hypothesmith)."""
import ast
import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch installed")
def test_torch_sources_sample():
    import crash_corpus

    paths = crash_corpus.torch_sources()
    import random

    sample = random.Random(1).sample(paths, 150)
    fig = crash_corpus.run(sample)
    assert fig["files"] == 150
    assert fig["internal_errors"] == [] and fig["fixes_that_do_not_parse"] == [] and fig["not_idempotent"] == []


hypothesis = pytest.importorskip("hypothesis")
hypothesmith = pytest.importorskip("hypothesmith")


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(hypothesmith.from_grammar())
def test_generated_modules(source):
    from ampfix.engine.check import check_source
    from ampfix.registry import all_rules
    from ampfix.model.settings import Settings

    data = source.encode("utf-8", "surrogatepass")
    r = check_source(data, "gen.py", all_rules(), Settings(), fix="unsafe")
    if r.changed:
        ast.parse(r.fixed)
        assert not check_source(r.fixed_bytes, "gen.py", all_rules(), Settings(), fix="unsafe").changed
