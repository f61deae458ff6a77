"""Twenty-fifth round: shapes of the twenty-fifth batch (measured before these fixes).

1. A trainer's `_forward` computes the loss in its own block, then, under `if backprop:`, divides
   it for accumulation in one branch and scales it in another: the search for the forward pass
   stopped at the division (in the branch) and went to the callers for `args`, which it read.
   The division only rescales the loss: the forward pass is further out.
2. `def train_fn(self, loader, ...)` at module level, made a method of a class by a class
   decorator (`@_add_methods_from(train)`): `self.train_fn(...)` cannot be followed, so a
   keyword-only `scaler` nobody passes would break the call.  It is refused, with the reason."""
import ast
import filecmp

from ampfix.migration.flow import forward_region
from ampfix.model.semantic import Model

from test_round17_shapes import run, write

RESCALE_IN_BRANCH = '''\
import torch
from apex import amp


class Trainer(object):
    def _forward(self, args, inputs, labels, model, backprop=True):
        outputs = model(inputs, labels=labels) if args.mlm else model(inputs)
        loss = outputs[0]
        if backprop:
            if args.gradient_accumulation_steps > 1:
                loss = loss / args.gradient_accumulation_steps
            if args.fp16:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            return loss
        return loss

    def train(self, args, data, model):
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.fp16:
            model, self.optimizer = amp.initialize(model, self.optimizer, opt_level="O1")
        for inputs, labels in data:
            self._forward(args, inputs, labels, model)
            self.optimizer.step()
            self.optimizer.zero_grad()
'''


def test_a_rescale_in_a_branch_does_not_hide_the_forward_pass_before_it(tmp_path):
    write(tmp_path, {"trainer.py": RESCALE_IN_BRANCH})
    out = run(tmp_path, "--write", "-q")
    assert out.exit_code == 0, out.output
    text = (tmp_path / "trainer.py").read_text()
    assert "apex" not in text
    region = text.index("with torch.autocast(")
    # the forward pass and the loss are under autocast; the division and the backward are not
    assert region < text.index("outputs = model(") < text.index("loss = outputs[0]") < text.index("if backprop:")
    assert "\n        if backprop:\n" in text
    assert "\n                loss = loss / args.gradient_accumulation_steps\n" in text
    assert "self.scaler.scale(loss).backward()" in text and "self.scaler.step(self.optimizer)" in text
    compile(text, "trainer.py", "exec")
    assert "Would rewrite 0 files" in run(tmp_path).output


def _region(text):
    tree = ast.parse(text)
    Model(tree)  # links each node to its parent
    func = tree.body[2].body[0]
    site = next(n for n in ast.walk(func) if isinstance(n, ast.With))
    region, _ = forward_region(site, site.items[0].context_expr.args[0], func, (), {"model"})
    return [ast.unparse(s).split("\n")[0] for s in region.stmts]


def test_the_forward_search_steps_over_rescales_only():
    """`loss = loss / n` (or `loss /= n`, `loss = loss.mean()`) in a branch: the forward pass is
    further out.  `loss = self.weigh(loss, inputs)` may run model code: the search stops there,
    as it did before."""
    assert _region(RESCALE_IN_BRANCH)[0].startswith("outputs = model(")
    for rescale in ("loss /= args.gradient_accumulation_steps", "loss = loss.mean() / 2"):
        text = RESCALE_IN_BRANCH.replace("loss = loss / args.gradient_accumulation_steps", rescale)
        assert _region(text) == ["outputs = model(inputs, labels=labels) if args.mlm else model(inputs)",
                                 "loss = outputs[0]"], rescale
    text = RESCALE_IN_BRANCH.replace("loss = loss / args.gradient_accumulation_steps",
                                     "loss = self.weigh(loss, inputs)")
    assert _region(text) == ["if args.gradient_accumulation_steps > 1:"]


TRAIN = '''\
from apex import amp

from .utils import register_method

__methods__ = []
register = register_method(__methods__)


@register
def train_fn(self, loader):
    for inputs, targets in loader:
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(inputs), targets)
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        self.optimizer.step()
'''

FIT = '''\
from apex import amp


def fit(self, loader, epochs, fp16=False):
    self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O2", enabled=fp16)
    for _ in range(epochs):
        self.train_fn(loader)
'''

RUNNER = '''\
from . import fit, train
from .utils import add_methods_from


@add_methods_from(fit)
@add_methods_from(train)
class Runner:
    def __init__(self, model, optimizer, loss_fn):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
'''

UTILS = '''\
def register_method(methods):
    def register(method):
        methods.append(method)
        return method
    return register


def add_methods_from(module):
    def decorate(cls):
        for method in module.__methods__:
            setattr(cls, method.__name__, method)
        return cls
    return decorate
'''


def test_a_module_level_method_is_refused_not_given_a_parameter_nobody_passes(tmp_path):
    files = {"lib/__init__.py": "", "lib/train.py": TRAIN, "lib/fit.py": FIT.replace(
        "from apex import amp\n", "from apex import amp\n\n__methods__ = []\n"), "lib/runner.py": RUNNER,
        "lib/utils.py": UTILS}
    write(tmp_path, files)
    out = run(tmp_path, "--write")
    assert "`train_fn` takes `self` outside a class" in out.output, out.output
    for rel, text in files.items():
        assert (tmp_path / rel).read_text() == text, rel
    assert not filecmp.cmp(tmp_path / "lib/train.py", tmp_path / "lib/fit.py", shallow=False)


META = '''\
import torch
from apex import amp

from .trainer import Trainer


class MetaTrainer(Trainer):
    def _forward(self, args, inputs, labels, model, backprop=True):
        loss = model(inputs)[0]
        if backprop:
            with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                scaled_loss.backward()
            meta_loss = self.meta(loss.detach())
            self.meta_optimizer.zero_grad()
            meta_loss.backward()
            self.meta_optimizer.step()
        return loss
'''


def test_copies_of_a_class_in_other_packages_are_not_its_subclass_bases(tmp_path):
    """Three packages each with a `Trainer`; one has `MetaTrainer(Trainer)` (its own, imported
    relatively) with a plain backward of a meta-optimizer, so its group refuses.  The other
    packages' trainers are other classes: they migrate (a base matched by name alone had joined
    them all into the refused group)."""
    trainer = RESCALE_IN_BRANCH.replace("from apex import amp\n", "from apex import amp\nfrom common import X\n")
    files = {"top/common.py": "X = 1\n", "top/a/__init__.py": "", "top/a/trainer.py": trainer, "top/a/meta.py": META,
             "top/b/__init__.py": "", "top/b/trainer.py": trainer}
    write(tmp_path, files)
    out = run(tmp_path, "--write")
    assert "top/b/trainer.py: rewritten" in out.output, out.output
    assert "apex" not in (tmp_path / "top/b/trainer.py").read_text()
    assert (tmp_path / "top/a/trainer.py").read_text() == trainer
    assert (tmp_path / "top/a/meta.py").read_text() == META
