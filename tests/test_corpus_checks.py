"""The corpus measurement's own checks (bench/migrate_corpus.py): what they count as broken must
be what breaks a user's code."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("migrate_corpus", ROOT / "bench" / "migrate_corpus.py")
mc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mc)

BEFORE = '''
class Model:
    @classmethod
    def _load(cls, config, weights):
        return cls()

def train(model, optimizer, loader):
    pass
'''
AFTER = '''
class Model:
    @classmethod
    def _load(cls, config, weights, scaler):
        return cls()

def train(model, optimizer, loader, scaler, amp_dtype=None):
    pass
'''


def added(tmp_path):
    """The parameters the rewrite of m.py added, each with the file that defines it."""
    return [(*a, str(tmp_path / "m.py")) for a in mc.added_required(BEFORE, AFTER)]


def test_added_required_parameters_are_found():
    got = mc.added_required(BEFORE, AFTER)
    assert [(f, c, new) for f, c, _, new in got] == [("_load", "Model", "scaler"), ("train", None, "scaler")]
    # a parameter with a default is not required; an unchanged signature adds nothing
    assert mc.added_required(BEFORE, BEFORE) == []


def test_a_call_that_does_not_pass_the_new_parameter_is_reported(tmp_path):
    (tmp_path / "m.py").write_text(AFTER)
    (tmp_path / "run.py").write_text(
        "from m import Model, train\n"
        "Model._load(cfg, w)\n"                      # misses scaler: a TypeError
        "train(m, o, l, scaler)\n"                   # passes it by position
        "train(m, o, l, scaler=s)\n"                 # by keyword
        "train(*args)\n")                            # cannot tell: not counted
    missing, unseen = mc.unpassed(tmp_path, added(tmp_path))
    assert [text for _, text in missing] == ["run.py:2 _load(...) without `scaler`"]
    assert unseen == set()


def test_a_parameter_no_call_reaches_is_counted_apart(tmp_path):
    (tmp_path / "m.py").write_text(AFTER)
    missing, unseen = mc.unpassed(tmp_path, added(tmp_path))
    assert missing == []
    home = str(tmp_path / "m.py")
    assert unseen == {("_load", "Model", "scaler", home), ("train", None, "scaler", home)}


def test_calls_by_name_alone_are_listed_for_parameters_no_bound_call_reaches(tmp_path):
    """A method a class decorator attaches (`def train_fn(self, loader, *, scaler)` at module
    level) is called as `self.train_fn(loader)` from another attached function: no binding finds
    that call, so the parameter counts as reached by none; the call by name is listed apart."""
    (tmp_path / "train.py").write_text("def train_fn(self, loader, *, scaler):\n    pass\n")
    (tmp_path / "fit.py").write_text(
        "def fit(self, loader):\n"
        "    self.train_fn(loader)\n"                  # by name, without it: listed
        "    self.train_fn(loader, scaler=s)\n"        # passes it: not listed
        "    self.train_fn()\n")                       # no argument (`model.train()`-like): not listed
    got = [("train_fn", None, ["self", "loader"], "scaler", str(tmp_path / "train.py"))]
    missing, unseen = mc.unpassed(tmp_path, got)
    assert missing == [] and unseen == {("train_fn", None, "scaler", str(tmp_path / "train.py"))}
    listed = mc.unbound_calls(tmp_path, unseen)
    assert [text for _, text in listed] == ["fit.py:2 train_fn(...) without `scaler` (not bound)"]


def test_calls_are_matched_as_python_would_bind_them(tmp_path):
    (tmp_path / "m.py").write_text(AFTER)
    (tmp_path / "run.py").write_text(
        "import m\n"
        "from m import Model as Restorer\n"
        "model.train()\n"                            # a method of another object: not `train`
        "m.train(a, b, c)\n"                         # through its module: misses scaler
        "Restorer._load(cfg, w, scaler=s)\n")
    missing, unseen = mc.unpassed(tmp_path, added(tmp_path))
    assert [text for _, text in missing] == ["run.py:4 train(...) without `scaler`"]
    assert unseen == set()


def test_a_script_with_its_own_function_of_that_name_is_not_a_caller(tmp_path):
    (tmp_path / "m.py").write_text(AFTER)
    (tmp_path / "other.py").write_text("def train(model, optimizer, loader):\n    pass\n\ntrain(a, b, c)\n")
    (tmp_path / "uses.py").write_text("from m import train\ntrain(a, b, c)\n")
    missing, _ = mc.unpassed(tmp_path, added(tmp_path))
    assert [text for _, text in missing] == ["uses.py:2 train(...) without `scaler`"]


def test_methods_are_matched_through_self_super_or_their_class_only(tmp_path):
    (tmp_path / "m.py").write_text(AFTER + """

class Sub(Model):
    def go(self):
        self._load(1, 2)                # its class's method: misses scaler
        self._optim._load(1, 2)         # another object's: not told
""")
    missing, unseen = mc.unpassed(tmp_path, added(tmp_path))
    assert [text for _, text in missing] == ["m.py:13 _load(...) without `scaler`"]


def test_the_measurement_refuses_to_run_without_ruff_unless_told(tmp_path, monkeypatch, capsys):
    # a run without ruff read 0 undefined names and 0 debris whatever the rewrite did
    import pytest

    monkeypatch.setattr(mc, "RUFF", None)
    with pytest.raises(SystemExit) as exc:
        mc.main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "--no-flakes" in capsys.readouterr().err


def test_merge_joins_runs_over_disjoint_repositories(tmp_path):
    """A batch measured after the rest (same ampfix) joins the main run: one summary, holdout and
    batches read from the manifest; a repository measured twice is an error."""
    import json

    import pytest

    entries = json.loads(mc.MANIFEST.read_text())["repos"]
    held = next(e["repo"].replace("/", "+") for e in entries if e.get("holdout") and e.get("batch"))
    tuned = next(e["repo"].replace("/", "+") for e in entries if not e.get("holdout"))

    def run(name, repo, status):
        d = {"modules": [{"repo": repo, "path": "t.py", "kind": "apex.amp", "uses": 1, "status": status,
                          "left": 0, "reason": None, "holdout": None, "batch": None}],
             "files": [{"repo": repo, "path": "t.py", "changed": True, "compiles": True},
                       {"repo": repo, "idempotent": True}]}
        p = tmp_path / name
        p.write_text(json.dumps(d))
        return p

    a, b = run("a.json", held, "migrated"), run("b.json", tuned, "refused")
    assert mc.merge([a, b], tmp_path / "out") == 0
    d = json.loads((tmp_path / "out" / "corpus.json").read_text())
    s = d["summary"]
    assert s["apex.amp modules"] == 2 and s["apex.amp migrated right"] == 1 and s["refused"] == 1
    assert s["holdout"]["apex.amp migrated right"] == 1 and s["tuned"]["refused"] == 1
    assert s["files written"] == 2
    assert next(m for m in d["modules"] if m["repo"] == held)["holdout"] is True
    with pytest.raises(SystemExit):
        mc.merge([a, run("c.json", held, "refused")], None)


def test_a_class_picked_by_a_conditional_expression_is_a_call_of_its_init(tmp_path):
    """``(AMPTrainer if fp16 else Model)(cfg)`` builds whichever the test picks: a call of
    ``Model.__init__`` that must pass what it now requires."""
    (tmp_path / "m.py").write_text("class Model:\n    def __init__(self, cfg, *, scaler):\n        pass\n")
    (tmp_path / "run.py").write_text("from m import Model\n"
                                     "(Other if fp16 else Model)(cfg)\n"              # misses scaler
                                     "(Other if fp16 else Model)(cfg, scaler=s)\n")   # passes it
    got = [("__init__", "Model", ["self", "cfg"], "scaler", str(tmp_path / "m.py"))]
    missing, unseen = mc.unpassed(tmp_path, got)
    assert [text for _, text in missing] == ["run.py:2 Model(...) without `scaler`"]
    assert unseen == set()


REGION = '''
import torch
def run(model, loader, evaluate):
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = criterion(logits, y)
        loss.backward()
{after}
'''


def _numpy_lines(after: str) -> list:
    text = REGION.format(after=after)
    return [text.splitlines()[n - 1].strip() for n in mc.bf16_numpy(text)]


def test_a_region_output_handed_to_numpy_is_counted():
    assert _numpy_lines("    preds = logits.detach().cpu().numpy()\n") == ["preds = logits.detach().cpu().numpy()"]
    # through a binding that keeps the dtype
    assert _numpy_lines("    out = logits.detach()\n    p = out.cpu().numpy()\n") == ["p = out.cpu().numpy()"]
    # a loss is float32 under autocast
    assert _numpy_lines("    l = loss.detach().cpu().numpy()\n") == []


def test_a_value_computed_again_outside_the_region_is_not_the_regions():
    # the evaluation loop computes logits again, in float32, under no_grad
    assert _numpy_lines(
        "    for x, y in evaluate:\n"
        "        with torch.no_grad():\n"
        "            logits = model(x)\n"
        "        preds = logits.detach().cpu().numpy()\n") == []
    # a conversion that fixes the dtype
    assert _numpy_lines("    logits = logits.cuda().float()\n    p = logits.cpu().numpy()\n") == []


def test_a_rebinding_off_the_way_or_undone_still_counts():
    # only on one branch: the other way reaches numpy with the region's value
    assert _numpy_lines(
        "    if evaluate:\n"
        "        logits = model(x).float()\n"
        "    p = logits.cpu().numpy()\n") == ["p = logits.cpu().numpy()"]
    # bound again from the region's values between the fresh value and the call
    assert _numpy_lines(
        "    saved = logits\n"
        "    logits = model(x).float()\n"
        "    logits = saved\n"
        "    p = logits.cpu().numpy()\n") == ["p = logits.cpu().numpy()"]
    # a value that reads the region's output through an op that keeps bfloat16 is no fresh value
    assert _numpy_lines("    logits = torch.sigmoid(logits)\n    p = logits.cpu().numpy()\n") == [
        "p = logits.cpu().numpy()"]


def test_a_scaler_defaulted_in_its_function_is_not_none_after_the_default():
    src = ("def run(loss, opt, *, scaler=None):\n"
           "{default}"
           "    scaler.scale(loss).backward()\n"
           "    scaler.step(opt)\n")
    assert mc.none_scaler_calls(src.format(default="")) == [2, 3]
    default = "    if scaler is None:\n        scaler = GradScaler(enabled=False)\n"
    assert mc.none_scaler_calls(src.format(default=default)) == []
    # a default under a condition of something else, or one that binds None again, is no default
    other = "    if opt is None:\n        scaler = GradScaler(enabled=False)\n"
    assert mc.none_scaler_calls(src.format(default=other)) == [4, 5]
    again = "    if scaler is None:\n        scaler = None\n"
    assert mc.none_scaler_calls(src.format(default=again)) == [4, 5]


def test_a_globals_dispatch_is_a_call_of_each_function_it_may_pick(tmp_path):
    (tmp_path / "t.py").write_text(
        "def worker(args, model, optimizer, scaler):\n"
        "    globals().get('train_' + args.target)(args, model, optimizer, scaler=scaler)\n"
        "    globals()[f'{args.target}_eval'](args, model)\n"
        "def train_bert(args, model, optimizer, *, scaler):\n    pass\n"
        "def train_lm(args, model, optimizer, *, scaler):\n    pass\n"
        "def cls_eval(args, model, *, scaler):\n    pass\n")
    home = str(tmp_path / "t.py")
    got = [("train_bert", None, ["args", "model", "optimizer"], "scaler", home),
           ("train_lm", None, ["args", "model", "optimizer"], "scaler", home),
           ("cls_eval", None, ["args", "model"], "scaler", home)]
    missing, unseen = mc.unpassed(tmp_path, got)
    # the first pick passes it to both `train_*`; the second does not pass it to `cls_eval`
    assert [text for _, text in missing] == ["t.py:3 cls_eval(...) without `scaler`"]
    assert unseen == set()


def test_a_float16_model_left_beside_a_gradscaler_is_counted():
    # the project's own network_to_half kept after FP16_Optimizer went: GradScaler cannot unscale
    kept = ("import torch\nmodel = Net()\nmodel = network_to_half(model)\n"
            "scaler = torch.amp.GradScaler('cuda')\nopt = torch.optim.Adam(model.parameters())\n")
    assert mc.half_models(kept) == [3]
    assert mc.half_models("import torch\nmodel = Net().cuda().half()\nopt = SGD(model.parameters())\n"
                          "scaler = torch.amp.GradScaler('cuda')\n") == [2]
    # an input cast, or no GradScaler in that function: not counted
    assert mc.half_models("import torch\nx = x.half()\nopt = SGD(model.parameters())\n"
                          "scaler = torch.amp.GradScaler('cuda')\n") == []
    assert mc.half_models("def export(model):\n    model.half()\n    return model.parameters()\n") == []
    # a loader named for fp16 checkpoints puts weights into the model; it does not make it float16
    assert mc.half_models("import torch\nopt = SGD(model.parameters())\nscaler = torch.amp.GradScaler('cuda')\n"
                          "load_state_dict_flexible_with_fp16(model, sd)\nmodel = network_to_half(model)\n") == [5]


def test_a_removed_name_another_file_imports_is_reported():
    # the fallback BertLayerNorm went from modeling.py while modeling_gpt2.py and an absolute importer
    # still take it from there: ImportError in those files, which the per-file checks cannot see
    before = ("try:\n    from apex.normalization import FusedLayerNorm as BertLayerNorm\nexcept ImportError:\n"
              "    class BertLayerNorm:\n        pass\n\ndef gelu(x):\n    return x\n")
    after = "def gelu(x):\n    return x\n"
    others = {"pkg/modeling.py": after,
              "pkg/modeling_gpt2.py": "from .modeling import BertLayerNorm as LayerNorm\n",
              "app/visual.py": "from pkg.modeling import BertLayerNorm, gelu\n",
              "other/modeling_copy.py": "from .modeling import BertLayerNorm\n",  # its own package's copy
              "x.py": "from torch.nn import BertLayerNorm\n",
              # another package's module of the same name
              "other/src/task.py": "from lxrt.modeling import BertLayerNorm\n"}
    assert mc.importers_of_removed("pkg/modeling.py", before, after, others) == [
        "pkg/modeling_gpt2.py line 1: BertLayerNorm", "app/visual.py line 1: BertLayerNorm"]
    assert mc.importers_of_removed("pkg/modeling.py", before, before, others) == []


def test_a_keyword_added_that_no_function_of_that_name_takes_is_reported():
    # a helper whose file was not rewritten with its caller (the part that made it take the
    # scaler was dropped): the added `scaler=` is a TypeError where it runs
    before = "from ckpt import load\nload(model, optimizer, path)\nsave(model, path)\n"
    after = "from ckpt import load\nload(model, optimizer, path, scaler=scaler)\nsave(model, path, scaler=scaler)\n"
    others = {"ckpt.py": "def load(model, optimizer, path):\n    pass\n\n\ndef save(model, path, **extra):\n    pass\n"}
    assert mc.unaccepted_keywords(before, after, others) == [
        "`load(..., scaler=...)`: no `load` of the project takes `scaler`"]
    # taken, as a parameter or into **kwargs, or a function the project does not define: not counted
    others["ckpt.py"] = "def load(model, optimizer, path, *, scaler):\n    pass\n"
    assert mc.unaccepted_keywords(before, after, others) == []
    assert mc.unaccepted_keywords(before, after, {}) == []
    assert mc.unaccepted_keywords(before, before, others) == []


def test_a_planners_own_report_is_not_counted_as_a_module_of_apex():
    # a file a migration edits without an apex use of its own (a helper that now takes the scaler)
    # gets the planner's report; since round 50 AMP102/AMP104 say it for FP16_Optimizer migrations.
    # It is no module that uses apex, for either kind
    assert mc.kind({"code": "AMP102", "message": "`apex.fp16_utils.FP16_Optimizer` is NVIDIA apex"}) == "FP16_Optimizer"
    assert mc.kind({"code": "AMP104", "message": "`apex.optimizers.FP16_Optimizer` is NVIDIA apex; use"}) == \
        "FP16_Optimizer"
    assert mc.kind({"code": "AMP101", "message": "`apex.amp.initialize` is NVIDIA apex"}) == "apex.amp"
    for code in ("AMP101", "AMP102", "AMP104"):
        assert mc.kind({"code": code, "message": "rewritten with main.py: this file's part of their migration"}) is None
        assert mc.kind({"code": code, "message": "`clip` receives the FP16_Optimizer made in train.py (line 16)"}) \
            is None
