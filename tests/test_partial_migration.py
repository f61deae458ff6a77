"""A function that initializes apex twice is migrated whole or not at all: one initialize left
behind keeps apex's patching of torch for the whole run, beside native AMP for the other."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

CODE = textwrap.dedent("""\
    from apex import amp


    def setup(model_g, model_d, opt_g, extra):
        model_g, opt_g = amp.initialize(model_g, opt_g, opt_level="O1")
        model_d, opts_d = amp.initialize(model_d, [model_d.opt] + extra, opt_level="O1")
        return model_g, opt_g, opts_d


    def train(loader, model_g, model_d, opt_g, extra):
        model_g, opt_g, opts_d = setup(model_g, model_d, opt_g, extra)
        for x in loader:
            loss = model_g(x)
            with amp.scale_loss(loss, opt_g) as scaled:
                scaled.backward()
            opt_g.step()
""")


def test_two_initializes_in_one_function_go_together():
    res = check_source(CODE.encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert res.fixed in (None, CODE), res.fixed
    amp = [d for d in res.diagnostics if d.code == "AMP101"]
    assert amp and all("never used with amp.scale_loss" in d.message for d in amp if "not rewritten" in d.message)
    assert any("line 6" in d.message for d in amp)


def test_an_optimizer_kept_on_self_is_not_taken_for_an_evaluation_script():
    """`self.model, self.optimizer = amp.initialize(...)`: another method may train with it, so
    the seed is not an inference one even when nothing in this module runs a backward."""
    code = textwrap.dedent("""\
        from apex import amp


        class T:
            def setup(self, model, optimizer):
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")
                self.model.eval()
                return self.model(1)
    """)
    res = check_source(code.encode(), "x.py", all_rules(), Settings(), fix="safe")
    assert res.fixed in (None, code)
    assert any(d.code == "AMP101" and "never used with amp.scale_loss" in d.message for d in res.diagnostics)
