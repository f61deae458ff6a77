"""Edges of this round's migration classes: where each must hold back."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules


def migrate(code: str):
    return check_source(textwrap.dedent(code).encode(), "x.py", all_rules(), Settings(), fix="safe")


def amp101(res):
    return [d for d in res.diagnostics if d.code == "AMP101"]


def test_self_amp_given_another_value_too_is_not_an_alias():
    """`self.amp = amp` in one method and `self.amp = Something()` in another: self.amp is not
    apex's amp everywhere, so nothing through it is rewritten and the module stays whole."""
    code = """\
        from apex import amp


        class T:
            def __init__(self, model, opt):
                self.amp = amp
                self.model, self.opt = self.amp.initialize(model, opt, opt_level="O1")

            def reset(self):
                self.amp = object()

            def step(self, loss):
                with self.amp.scale_loss(loss, self.opt) as s:
                    s.backward()
                self.opt.step()
    """
    res = migrate(code)
    assert res.fixed in (None, textwrap.dedent(code))
    assert amp101(res)


def test_self_amp_none_when_off_is_still_the_alias():
    code = """\
        import torch


        class T:
            def __init__(self, model, opt, fp16):
                self.amp = None
                self.model, self.opt = model, opt
                self.fp16 = fp16
                if fp16:
                    from apex import amp
                    self.amp = amp
                    self.model, self.opt = self.amp.initialize(model, opt, opt_level="O1")

            def step(self, x):
                loss = self.model(x)
                if self.fp16:
                    with self.amp.scale_loss(loss, self.opt) as s:
                        s.backward()
                else:
                    loss.backward()
                self.opt.step()
    """
    res = migrate(code)
    assert res.fixed and "self.amp" not in res.fixed, res.fixed
    assert "self.scaler.scale(loss).backward()" in res.fixed and not amp101(res)


def test_a_list_read_other_than_by_unpacking_keeps_the_seed_home():
    """`opts = initialize(model, [a, b])` later used as a whole (`for o in opts`): it is not
    returned under other names, so the seed does not move to the caller."""
    code = """\
        from apex import amp


        def setup(model, a, b):
            model, opts = amp.initialize(model, [a, b], opt_level="O1")
            for o in opts:
                o.zero_grad()
            first, second = opts[0], opts[1]
            return model, first, second


        def train(loader, model, a, b):
            model, first, second = setup(model, a, b)
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, [first, second]) as s:
                    s.backward()
                first.step()
                second.step()
    """
    res = migrate(code)
    assert res.fixed in (None, textwrap.dedent(code))
    assert amp101(res)


def test_elif_negation_keeps_the_chain_and_reads_each_test():
    code = """\
        from apex import amp


        def train(args, model, optimizer, loader):
            if args.backend == "deepspeed":
                model.enable_deepspeed()
            elif args.backend == "fairscale":
                model.enable_fairscale()
            else:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O2")
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as s:
                    s.backward()
                optimizer.step()
    """
    res = migrate(code)
    assert 'enabled=args.backend != "deepspeed" and args.backend != "fairscale"' in res.fixed, res.fixed
    assert 'elif args.backend == "fairscale":' in res.fixed and "model.enable_deepspeed()" in res.fixed
    compile(res.fixed, "x.py", "exec")
