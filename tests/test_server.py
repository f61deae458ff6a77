"""`ampfix server` driven over stdio as an editor drives it: initialize, didOpen, didChange,
publishDiagnostics, codeAction (applying the edits it returns), hover, shutdown."""
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pygls")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lsp_client import LspClient  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ROOT / "fixtures" / "projects"
BAD = "import torch\nopt.zero_grad(set_to_none=False)\nx = torch.zeros(3).cuda()\n"


def open_doc(c, path: Path, text=None, version=1):
    uri = path.as_uri()
    c.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": version,
                                                       "text": path.read_text() if text is None else text}})
    return uri


def change(c, uri, text, version):
    c.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                        "contentChanges": [{"text": text}]})


def codes(msg):
    return sorted(d["code"] for d in msg["params"]["diagnostics"])


def apply(edit, read):
    """The texts a client has after applying a WorkspaceEdit: uri -> text."""
    out = {}
    changes = dict(edit.get("changes") or {})
    for dc in edit.get("documentChanges") or []:
        changes.setdefault(dc["textDocument"]["uri"], []).extend(dc["edits"])
    for uri, edits in changes.items():
        (e,) = edits  # ampfix replaces the whole text
        old = read(uri)
        assert e["range"]["start"] == {"line": 0, "character": 0}
        assert e["range"]["end"]["line"] == len(old.split("\n")) - 1
        out[uri] = e["newText"]
    return out


@pytest.fixture
def client(tmp_path):
    c = LspClient(str(tmp_path))
    c.initialize(tmp_path.as_uri())
    yield c
    assert c.close() == 0


def test_diagnostics_on_open_with_codes_ranges_and_links(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    msg = client.diagnostics(uri)
    diags = msg["params"]["diagnostics"]
    assert codes(msg) == ["AMP301", "AMP302"]
    d302 = next(d for d in diags if d["code"] == "AMP302")
    assert d302["range"] == {"start": {"line": 2, "character": 4}, "end": {"line": 2, "character": 25}}
    assert d302["source"] == "ampfix"
    # the rule's documentation opens from a file the server wrote (no web page that may not exist)
    href = d302["codeDescription"]["href"]
    assert href.startswith("file://") and href.endswith(".md#amp302"), href
    from urllib.parse import urlparse
    from urllib.request import url2pathname

    assert "## AMP302" in Path(url2pathname(urlparse(href).path)).read_text()
    assert d302["severity"] == 2


def test_the_editors_text_not_the_file_on_disk(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import torch\n")
    uri = open_doc(client, f, text=BAD)
    assert codes(client.diagnostics(uri)) == ["AMP301", "AMP302"]


def test_a_typing_burst_gives_one_final_diagnostic_set(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text("import torch\n")
    uri = open_doc(client, f)
    client.diagnostics(uri)
    start = time.monotonic()
    text = "import torch\n"
    for i in range(100):  # 100 changes within a second, the last one a problem
        text = "import torch\n" + "".join(f"a{k} = {k}\n" for k in range(i)) + ("x = torch.zeros(3).cuda()\n" if i == 99 else "")
        change(client, uri, text, i + 2)
        time.sleep(0.005)
    assert time.monotonic() - start < 2
    got = [m for m in client.drain(2.0) if m.get("method") == "textDocument/publishDiagnostics"]
    assert got, "no diagnostics after the burst"
    assert len(got) <= 3, f"{len(got)} diagnostic sets for one burst: no debounce"
    assert got[-1]["params"]["version"] == 101 and codes(got[-1]) == ["AMP302"]


def test_a_syntax_error_while_typing_is_one_diagnostic(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    client.diagnostics(uri)
    change(client, uri, "import torch\nx = torch.zeros(3).cuda(\n", 2)
    msg = client.diagnostics(uri)
    assert codes(msg) == ["AMP000"] and msg["params"]["diagnostics"][0]["severity"] == 1
    change(client, uri, BAD, 3)
    assert codes(client.diagnostics(uri)) == ["AMP301", "AMP302"]


def test_quick_fix_equals_migrate_write(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    diags = client.diagnostics(uri)["params"]["diagnostics"]
    d302 = next(d for d in diags if d["code"] == "AMP302")
    res = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": d302["range"],
                                                     "context": {"diagnostics": [d302]}})["result"]
    fix = next(a for a in res if "device" in a["title"])
    got = apply(fix["edit"], lambda u: BAD)[uri]
    ref = tmp_path / "ref.py"
    ref.write_text(BAD)
    subprocess.run([sys.executable, "-m", "ampfix", "migrate", "--write", "--select", "AMP302", str(ref)],
                   capture_output=True)
    assert got == ref.read_text()
    # the unsafe AMP301 fix is not offered unless unsafe fixes are allowed
    d301 = next(d for d in diags if d["code"] == "AMP301")
    res = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": d301["range"],
                                                     "context": {"diagnostics": [d301]}})["result"]
    quick = [a for a in res if a["kind"] == "quickfix"]
    assert [a["title"] for a in quick] == ["ampfix: add `# noqa: AMP301` on this line"]
    noqa = apply(quick[0]["edit"], lambda u: BAD)[uri]
    assert "opt.zero_grad(set_to_none=False)  # noqa: AMP301\n" in noqa


def test_unsafe_fixes_when_the_settings_allow_them(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    c = LspClient(str(tmp_path))
    c.initialize(tmp_path.as_uri(), {"unsafeFixes": True, "ignore": ["AMP302"]})
    try:
        uri = open_doc(c, f)
        diags = c.diagnostics(uri)["params"]["diagnostics"]
        assert [d["code"] for d in diags] == ["AMP301"]
        res = c.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diags[0]["range"],
                                                    "context": {"diagnostics": diags}})["result"]
        fix = next(a for a in res if "unsafe" in a["title"])
        assert "opt.zero_grad()\n" in apply(fix["edit"], lambda u: BAD)[uri]
    finally:
        assert c.close() == 0


def test_an_apex_migration_spans_two_files_and_equals_migrate_write(client, tmp_path):
    work = tmp_path / "proj"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", work)
    ref = tmp_path / "ref"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", ref)
    subprocess.run([sys.executable, "-m", "ampfix", "migrate", "--write", str(ref)], capture_output=True)
    launcher = work / "tools" / "train_net.py"
    uri = open_doc(client, launcher)
    diags = [d for d in client.diagnostics(uri)["params"]["diagnostics"] if d["code"] == "AMP101"]
    assert diags
    res = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diags[0]["range"],
                                                     "context": {"diagnostics": diags[:1]}}, timeout=60)["result"]
    mig = next(a for a in res if "migrate apex" in a["title"])
    texts = apply(mig["edit"], lambda u: Path(u[len("file://"):]).read_text())
    assert len(texts) >= 2
    for u, text in texts.items():
        rel = Path(u[len("file://"):]).relative_to(work)
        assert text == (ref / rel).read_text(), rel


def test_a_dirty_document_is_not_migrated_and_says_why(client, tmp_path):
    work = tmp_path / "proj"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", work)
    launcher = work / "tools" / "train_net.py"
    uri = open_doc(client, launcher, text=launcher.read_text() + "\n# edited\n")
    diags = [d for d in client.diagnostics(uri)["params"]["diagnostics"] if d["code"] == "AMP101"]
    res = client.request("textDocument/codeAction", {"textDocument": {"uri": uri}, "range": diags[0]["range"],
                                                     "context": {"diagnostics": diags[:1]}}, timeout=60)["result"]
    mig = next(a for a in res if "migrate apex" in a["title"])
    assert "save the file first" in mig["disabled"]["reason"] and "edit" not in mig


def test_hover_explains_the_rule(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    client.diagnostics(uri)
    h = client.request("textDocument/hover", {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 8}})
    assert "AMP302" in h["result"]["contents"]["value"] and "Why is this bad" in h["result"]["contents"]["value"]


def test_a_config_file_edited_takes_effect_without_a_restart(client, tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    assert codes(client.diagnostics(uri)) == ["AMP301", "AMP302"]
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text('[tool.ampfix]\nignore = ["AMP302"]\n')
    client.notify("textDocument/didSave", {"textDocument": {"uri": cfg.as_uri()}})
    assert codes(client.diagnostics(uri)) == ["AMP301"]


def test_it_survives_malformed_requests_and_unknown_methods(client, tmp_path):
    client.send_raw(b"{not json")
    r = client.request("ampfix/noSuchMethod", {})
    assert "error" in r
    # invalid params (no position): pygls says so in a message, not in a response; the server goes on
    client.send({"jsonrpc": "2.0", "id": 999, "method": "textDocument/hover",
                 "params": {"textDocument": {"uri": "file:///nope.py"}}})
    client.wait(lambda m: m.get("method") == "window/showMessage")
    f = tmp_path / "t.py"
    f.write_text(BAD)
    uri = open_doc(client, f)
    assert codes(client.diagnostics(uri)) == ["AMP301", "AMP302"]


def test_a_client_that_vanishes_ends_the_server(tmp_path):
    c = LspClient(str(tmp_path))
    c.initialize(tmp_path.as_uri())
    c.proc.stdin.close()
    assert c.proc.wait(timeout=15) is not None


def test_notebook_documents_get_diagnostics_per_cell(client, tmp_path):
    nb = (tmp_path / "train.ipynb").as_uri()
    cells = ["import torch\n", "x = torch.zeros(3).cuda()\n", "y = 1\n"]
    uris = [f"{nb}#cell{i}" for i in range(len(cells))]
    client.notify("notebookDocument/didOpen", {
        "notebookDocument": {"uri": nb, "notebookType": "jupyter-notebook", "version": 1,
                             "cells": [{"kind": 2, "document": u} for u in uris]},
        "cellTextDocuments": [{"uri": u, "languageId": "python", "version": 1, "text": s}
                              for u, s in zip(uris, cells)]})
    got = {}
    for _ in uris:
        m = client.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                        and m["params"]["uri"] in uris and m["params"]["uri"] not in got)
        got[m["params"]["uri"]] = codes(m)
    assert got == {uris[0]: [], uris[1]: ["AMP302"], uris[2]: []}
    cell2 = next(m for m in client.seen if m.get("method") == "textDocument/publishDiagnostics"
                 and m["params"]["uri"] == uris[1])
    assert cell2["params"]["diagnostics"][0]["range"]["start"] == {"line": 0, "character": 4}  # in the cell
