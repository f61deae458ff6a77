"""Shapes met on the eighth round's repositories, as small inline scripts: an optimizer made only
to hand apex a second model (HobbitLong/CMC's momentum encoder), and how the enabled= of one
scaler reads when two initialize calls share it."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.migration.spell import conj, disj
from ampfix.model.settings import Settings
from ampfix.registry import all_rules

CMC = """\
    import torch
    from apex import amp


    def main(args, model, model_ema, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if args.amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)
            if args.moco:
                optimizer_ema = torch.optim.SGD(model_ema.parameters(), lr=0, momentum=0, weight_decay=0)
                model_ema, optimizer_ema = amp.initialize(model_ema, optimizer_ema, opt_level=args.opt_level)
        for x in loader:
            with torch.no_grad():
                k = model_ema(x)
            loss = (model(x) - k).pow(2).mean()
            optimizer.zero_grad()
            if args.amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
"""


def run(src):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings(), fix="safe")


def check(src):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings())


def test_an_optimizer_made_only_for_a_second_initialize_goes_with_it():
    out = run(CMC).fixed
    assert "optimizer_ema" not in out and "amp.initialize" not in out
    assert "if args.moco" not in out and "if args.amp" not in out  # emptied, they go
    assert out.count("GradScaler(") == 1
    assert 'enabled=bool(args.amp) and args.opt_level != "O0")' in out  # not `x or (x and y)`


def test_an_optimizer_read_elsewhere_stays():
    src = CMC.replace("            optimizer.step()\n", "            optimizer.step()\n            print(optimizer_ema)\n")
    out = run(src).fixed
    assert "optimizer_ema = torch.optim.SGD(" in out


def test_enabled_expressions_simplify_as_a_reviewer_would():
    assert disj("n > 1 and x", "n <= 1 and x") == "x"
    assert disj("a and b", "a") == "a" and disj("a", "a and b") == "a"
    assert disj("a", "b") == "(a) or (b)"
    assert conj("x != 'O0'", "x != \"O0\"") == "x != 'O0'"
    assert conj("a", "b and a") == "a and b"


ZEN = """\
    import torch
    from apex.optimizers import FP16_Optimizer, FusedAdam
    from pytorch_pretrained_bert.optimization import BertAdam


    def train(args, model, loader, writer):
        if args.fp16:
            model.half()
            optimizer = FusedAdam(model.parameters(), lr=1e-3)
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            optimizer = BertAdam(model.parameters(), lr=1e-3)
        for step, x in enumerate(loader):
            loss = model(x)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            writer.add_scalar("lr", optimizer.get_lr()[0], step)
"""


def test_a_method_fp16_optimizer_never_had_is_left_to_the_fp32_optimizer():
    """sinovation/ZEN: `optimizer.get_lr()` is BertAdam's (the fp32 path); FP16_Optimizer never
    had it, so the migration leaves it and says so (it used to refuse the module)."""
    out = run(ZEN).fixed
    assert "FP16_Optimizer" not in out and "scaler.scale(loss).backward()" in out
    assert 'writer.add_scalar("lr", optimizer.get_lr()[0], step)' in out
    found = check(ZEN).diagnostics
    assert any("never FP16_Optimizer's" in (d.fix_description or "") for d in found), found


def test_an_attribute_of_fp16_optimizer_itself_still_refuses():
    src = ZEN.replace('optimizer.get_lr()[0]', 'optimizer.overflow')
    assert "FP16_Optimizer(" in run(src).fixed
    found = check(src).diagnostics
    assert any("`optimizer.overflow`" in d.message and "no native counterpart" in d.message for d in found), found


def test_objectives_initialized_in_a_loop_share_one_scaler_made_before_it():
    """Issue 21 §1.4: a model and its optimizer per objective, initialized in a loop: one scaler
    before the loop, one update per training step after every objective's step."""
    from pathlib import Path

    after = (Path(__file__).resolve().parents[1] / "fixtures" / "apex" / "after" / "objectives_loop.py").read_text()
    lines = after.splitlines()
    made = next(i for i, x in enumerate(lines) if "GradScaler(" in x)
    assert lines[made + 1].strip().startswith("for k in range(args.heads):")
    step = next(i for i, x in enumerate(lines) if "scaler.step(optimizer)" in x)
    assert lines[step + 1] == "        scaler.update()"  # after the loop over the objectives


def test_options_that_change_from_turn_to_turn_refuse():
    src = """\
        import torch
        from apex import amp


        def main(args, nets):
            heads = []
            for level, net in zip(["O1", "O2"], nets):
                optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
                net, optimizer = amp.initialize(net, optimizer, opt_level=level)
                heads.append((net, optimizer))
            for net, optimizer in heads:
                loss = net(torch.ones(2)).sum()
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
    """
    assert "amp.initialize" in run(src).fixed
    found = check(src).diagnostics
    assert any("changes from one turn to the next" in d.message for d in found), found


NESTED = """\
    import torch
    from apex.optimizers import FP16_Optimizer, FusedAdam
    from pytorch_pretrained_bert.optimization import BertAdam


    def warmup_linear(x, warmup=0.002):
        return x / warmup if x < warmup else 1.0 - x


    def train(args, model, loader, t_total):
        if args.fp16:
            model.half()
        if args.fp16:
            optimizer = FusedAdam(model.parameters(), lr=args.lr, bias_correction=False)
            optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
        else:
            if args.from_pretrained:
                optimizer = BertAdam(model.parameters(), warmup=0.1, t_total=t_total)
            else:
                optimizer = BertAdam(model.parameters(), lr=args.lr, warmup=0.1, t_total=t_total)
        global_step = 0
        for x in loader:
            loss = model(x)
            if args.fp16:
                optimizer.backward(loss)
            else:
                loss.backward()
            if args.fp16:
                # modify learning rate with special warm up BERT uses
                lr_this_step = args.lr * warmup_linear(global_step / t_total, 0.1)
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr_this_step
            optimizer.step()
            optimizer.zero_grad()
            global_step += 1
"""


def test_the_fp16_warm_up_goes_when_every_fp32_optimizer_schedules_itself():
    """jiasenlu/vilbert_beta's shape: the fp32 optimizer is built in a nested if; the fp16 path's
    warm-up went unseen and ran on top of BertAdam's own (a warm-up applied twice)."""
    out = run(NESTED).fixed
    assert "FP16_Optimizer" not in out and "lr_this_step" not in out and "warm up" not in out
    assert "def warmup_linear" not in out and "global_step" not in out


def test_a_warm_up_that_cannot_go_refuses():
    src = NESTED.replace("optimizer = BertAdam(model.parameters(), warmup=0.1, t_total=t_total)",
                         "optimizer = BertAdam(model.parameters())")
    assert "FP16_Optimizer(" in run(src).fixed
    assert any("whether the fp16 path's own warm-up" in d.message for d in check(src).diagnostics)


def test_initialize_per_loss_scale_branch_makes_one_scaler_choosing_its_scale():
    """NVIDIA's BERT scripts (and their copies): `if args.loss_scale == 0: initialize(...,
    loss_scale="dynamic") else: initialize(..., loss_scale=args.loss_scale)`.  Two scalers were
    made one after the other (the second decided alone); now one scaler whose scale follows the
    branch, and the emptied `if/else` goes whole."""
    src = """\
        import torch
        from apex import amp


        def main(args, model, loader):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            if args.fp16:
                if args.loss_scale == 0:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale="dynamic")
                else:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=args.loss_scale)
            for x in loader:
                loss = model(x).sum()
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
    """
    out = run(src).fixed
    assert out.count("GradScaler(") == 1 and "apex" not in out and "if args.loss_scale == 0" not in out
    assert 'init_scale=2.0**16 if args.loss_scale in (None, 0, "dynamic") else float(args.loss_scale)' in out
    assert 'growth_interval=2000 if args.loss_scale in (None, 0, "dynamic") else 2**31 - 1' in out
    assert "enabled=bool(args.fp16)" in out


def test_a_comment_about_importing_apex_goes_with_the_import():
    """facebookresearch/CodeGen: `# online import to avoid installing if not used` right above
    `from apex import amp` inside a method, under its docstring."""
    src = '''\
        import torch


        class Trainer:
            def init_amp(self, model, optimizer):
                """
                Initialize AMP optimizer.
                """
                # online import to avoid installing if not used (eg in the CI)
                from apex import amp

                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                self.model, self.optimizer = model, optimizer

            def step(self, x):
                from apex import amp

                loss = self.model(x).sum()
                # keep this comment
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
                self.optimizer.step()
    '''
    out = run(src).fixed
    assert "online import" not in out and "keep this comment" in out
