"""The result cache of `ampfix check`: same output warm as cold, never stale, keyed on the files
a migration plan reads, bypassed by --no-cache, safe when runs overlap."""
import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from ampfix.engine.cache import Cache
from ampfix.cli import main

PROJECTS = Path(__file__).resolve().parents[1] / "fixtures" / "projects"
FIXABLE = "import torch\nx = torch.zeros(3).cuda()\n"


def check(*args, env=None):
    return CliRunner(env=env).invoke(main, ["check", "--exit-zero", *map(str, args)])


def entries(folder):
    return [p for p in Path(folder).rglob("*") if p.is_file()]


def test_warm_run_reads_the_cache_and_says_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AMPFIX_NO_CACHE", raising=False)
    work = tmp_path / "p"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", work)
    cold = check(work)
    assert entries(tmp_path / "cache")
    import ampfix.engine.run

    calls = []
    real = ampfix.engine.run._run_tasks
    planned = []
    monkeypatch.setattr(ampfix.engine.run, "_run_tasks",
                        lambda tasks, w, more=None, also=0, progress=None: calls.append((len(tasks), more))
                        or real(tasks, w, more, also, progress))
    import ampfix.project.planning

    monkeypatch.setattr(ampfix.project.planning, "plan_projects", lambda *a, **k: planned.append(1))
    warm = check(work)
    # nothing is checked again, and with every planned file's result cached nothing is planned
    assert warm.output == cold.output and calls == [(0, None)] and not planned


def test_never_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    assert "AMP302" in check(f).output
    f.write_text("import torch\nx = torch.zeros(3, device='cuda')\n")
    assert "AMP302" not in check(f).output
    # a change of settings is a different key
    f.write_text(FIXABLE)
    assert "AMP302" in check(f).output
    assert "AMP302" not in check("--ignore", "AMP302", f).output


def test_a_planned_file_is_keyed_on_the_whole_plan(tmp_path, monkeypatch):
    """engine/trainer.py's diagnostics depend on tools/train_net.py (where apex is initialized)."""
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "p"
    shutil.copytree(PROJECTS / "launcher_engine" / "before", work)
    first = check(work).output
    launcher = work / "tools" / "train_net.py"
    launcher.write_text(launcher.read_text().replace("amp.initialize(model, optimizer, opt_level=amp_opt_level)",
                                                     "(model, optimizer)"))
    second = check(work).output
    fresh = check("--no-cache", work).output
    assert second == fresh and second != first


def test_no_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    check("--no-cache", f)
    assert not (tmp_path / "cache").exists()


def test_unwritable_cache_costs_nothing(tmp_path, monkeypatch):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(blocker))
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    out = check(f)
    assert out.exit_code == 0 and "AMP302" in out.output


def test_overlapping_runs_agree(tmp_path):
    work = tmp_path / "w"
    work.mkdir()
    for i in range(60):
        (work / f"f{i}.py").write_text(FIXABLE * (i % 5 + 1))
    env = {"AMPFIX_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-m", "ampfix", "check", "--exit-zero", str(work)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert len(set(outs)) == 1 and outs[0].count("AMP302") == sum(i % 5 + 1 for i in range(60))
    again = subprocess.run([sys.executable, "-m", "ampfix", "check", "--exit-zero", str(work)], env=env,
                           capture_output=True, text=True).stdout
    assert again == outs[0]
    assert not [p for p in entries(tmp_path / "cache") if p.name.startswith(".tmp-")]


def test_corrupt_entry_is_a_miss(tmp_path):
    c = Cache(tmp_path)
    k = c.key("x")
    c.put(k, {"a": 1})
    assert c.get(k) == {"a": 1}
    path = next(p for p in entries(tmp_path) if p.name == k)
    path.write_bytes(b"\x80garbage")
    assert c.get(k) is None


def test_a_caller_without_apex_is_keyed_on_the_plan(tmp_path, monkeypatch):
    """embed.py never names apex, but the migration of model_utils.setup() edits it: a result
    cached for embed.py checked alone is not the one of the project, and a change of the
    caller alone re-plans."""
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    work = tmp_path / "p"
    shutil.copytree(PROJECTS / "setup_returns" / "before", work)
    alone = check(work / "embed.py").output
    whole = check(work).output
    assert whole == check("--no-cache", work).output
    assert "embed.py" in whole and "embed.py" not in alone
    embed = work / "embed.py"
    embed.write_text(embed.read_text() + "\n\ndef unused():\n    return None\n")
    assert check(work).output == check("--no-cache", work).output


def test_an_edit_replans_only_its_part(tmp_path, monkeypatch):
    """A folder of projects side by side: editing one re-plans that one; the others' plans
    and results come from the cache, and the output is what a fresh run says."""
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("launcher_engine", "dual_path", "setup_returns"):
        shutil.copytree(PROJECTS / name / "before", tmp_path / "w" / name)
    work = tmp_path / "w"
    check(work)
    import ampfix.project.planning

    asked = []
    real = ampfix.project.planning.plan_projects
    monkeypatch.setattr(ampfix.project.planning, "plan_projects",
                        lambda jobs, *a, **k: asked.extend(p for p, _ in jobs) or real(jobs, *a, **k))
    trainer = work / "launcher_engine" / "engine" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\n# edited\n")
    warm = check(work).output
    assert asked and all("launcher_engine" in p for p in asked)
    assert warm == check("--no-cache", work).output


def test_a_plan_that_asked_the_other_parts_is_redone_when_they_change(tmp_path, monkeypatch):
    """p1 scales a loss and never initializes apex; whether p2 initializes it decides AMP106 in
    p1 (apex raises at the first scaled backward when nothing initializes it)."""
    monkeypatch.setenv("AMPFIX_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "w" / "p1").mkdir(parents=True)
    (tmp_path / "w" / "p2").mkdir(parents=True)
    (tmp_path / "w" / "p1" / "engine.py").write_text(
        "from apex import amp\n\n\ndef step(loss, opt):\n    with amp.scale_loss(loss, opt) as s:\n"
        "        s.backward()\n    opt.step()\n")
    launcher = tmp_path / "w" / "p2" / "train.py"
    launcher.write_text("import torch\nfrom apex import amp\n\nmodel = torch.nn.Linear(2, 2)\n"
                        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                        "model, opt = amp.initialize(model, opt, opt_level='O1')\n")
    first = check(tmp_path / "w").output
    assert "AMP106" not in first
    launcher.write_text("import torch\n\nmodel = torch.nn.Linear(2, 2)\n")
    second = check(tmp_path / "w").output
    assert "AMP106" in second and second == check("--no-cache", tmp_path / "w").output


def test_the_cache_key_follows_the_code_not_only_the_version(monkeypatch, tmp_path):
    """An install from a newer commit of the same version (pre-commit's `rev: main`, an editable
    install) must not read results the older code cached."""
    import ampfix.engine.cache as cache

    a = cache.Cache(tmp_path).key("x.py", b"data")
    assert cache.Cache(tmp_path).key("x.py", b"data") == a
    monkeypatch.setattr(cache, "code_stamp", lambda: "another-build")
    assert cache.Cache(tmp_path).key("x.py", b"data") != a
