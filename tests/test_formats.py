"""Machine-readable output: SARIF 2.1.0 (validated against the official schema kept in
tests/data), GitLab Code Quality, documentation links, and docs/rules.md in step with the rules."""
import json
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from ampfix.cli import main
from ampfix.output.report import rules_markdown

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
CODE = ("import torch\nfrom apex import amp\n\nmodel = torch.nn.Linear(2, 2).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = torch.zeros(3).cuda()\n"
        "opt.zero_grad(set_to_none=False)\ndef broken(:\n")


def run(tmp_path, fmt, text=CODE):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    f = tmp_path / "pkg" / "train.py"
    f.write_text(text)
    g = tmp_path / "pkg" / "ok.py"
    g.write_text("import torch\nx = torch.zeros(3).cuda()\ny = torch.ones(2).cuda()\n")
    r = CliRunner().invoke(main, ["check", "--no-cache", "--output-format", fmt, "pkg"], catch_exceptions=False,
                           env={"PWD": str(tmp_path)})
    return r


def test_sarif_is_valid_sarif_2_1_0(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(tmp_path, "sarif")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    run_ = doc["runs"][0]
    rules = run_["tool"]["driver"]["rules"]
    results = run_["results"]
    assert {x["ruleId"] for x in results} == {"AMP000", "AMP302"}  # a syntax error hides the rest of train.py
    for res in results:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
        uri = res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert uri in ("pkg/train.py", "pkg/ok.py")  # relative, forward slashes: what code scanning maps
    amp302 = next(x for x in rules if x["id"] == "AMP302")
    assert amp302["properties"]["documentation"] == "docs/rules.md#amp302" and "## What it does" in amp302["help"]["text"]


def test_sarif_of_a_clean_run_is_valid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    r = CliRunner().invoke(main, ["check", "--no-cache", "--output-format", "sarif", "a.py"])
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert r.exit_code == 0 and doc["runs"][0]["results"] == []


def test_gitlab_code_quality(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(tmp_path, "gitlab", CODE.replace("def broken(:\n", ""))
    issues = json.loads(r.stdout)
    assert issues and all(set(i) == {"description", "check_name", "fingerprint", "severity", "location"}
                          for i in issues)
    fps = [i["fingerprint"] for i in issues]
    assert len(set(fps)) == len(fps)  # two AMP302 in ok.py stay two issues
    ok = [i for i in issues if i["location"]["path"] == "pkg/ok.py"]
    assert [i["location"]["positions"]["begin"]["line"] for i in ok] == [2, 3]
    # stable across runs: GitLab compares fingerprints between a branch and its base
    assert [i["fingerprint"] for i in json.loads(run(tmp_path, "gitlab", CODE.replace("def broken(:\n", "")).stdout)] == fps


def test_json_diagnostics_link_their_rule_documentation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = json.loads(run(tmp_path, "json").stdout)
    assert doc["diagnostics"] and all(d["url"] == f"docs/rules.md#{d['code'].lower()}" for d in doc["diagnostics"])


def test_rules_doc_is_generated_from_the_rules():
    assert (ROOT / "docs" / "rules.md").read_text() == rules_markdown()
