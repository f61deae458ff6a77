"""Forty-sixth round: what the public code of this round's new batch showed.

1. A resume that asks apex whether it can load its state (``if use_amp and 'amp' in resume_state
   and 'load_state_dict' in amp.__dict__:``, the ImageNet train scripts copied from timm before
   2020, several in one repository of backbones): a question of whether apex is installed (every
   apex has had ``amp.load_state_dict``), which native AMP always is.  The conjunct folds away,
   the load reads the GradScaler's state; before, ``amp.__dict__`` stopped the whole module ("has
   no automatic rewrite").  ``hasattr(amp, "state_dict")`` is the same question.
2. A setup that chooses apex's loss scale in a local just before the initialize (``if
   opt.apex_loss_scale != 'dynamic': apex_loss_scale = float(opt.apex_loss_scale) else:
   apex_loss_scale = 'dynamic'``) and returns the model and optimizer: the seed moves to the
   callers, and the choice with it, said there as one expression (dynamic where the option says
   "dynamic", else static at that scale); the ``if`` goes with the initialize when nothing else
   reads the name.  Before: "depends on `apex_loss_scale`, which its callers cannot see".
3. With ``--dtype bfloat16``, a list of optimizers built only for apex's scale_loss (``if
   optimizer_lif != None: optimizer_list = [optimizer, optimizer_lif] else: optimizer_list =
   [optimizer]``, then ``with amp.scale_loss(loss, optimizer_list)``): the backward is the loss's
   own and nothing reads the list any more; it was left behind, an unused local.  Its ``if``
   goes now.
4. A trainer with both paths and two flags (``with torch.cuda.amp.autocast() if self.using_amp
   else nullcontext(): loss = ...`` then ``if self.using_apex_amp: with amp.scale_loss(...)``,
   sockeye): the forward already has a native region, switched by the native path's flag; the
   migration put a region around the native path's ``loss = self._scaler.scale(loss)`` below it
   and left apex's forward in float32.  It refuses now, naming that ``with``.
5. Comments labelled with apex inside the branch that a collapsed ``if use_apex: ... else: ...``
   keeps (``# Apex AMP loss scaling`` above the ``with amp.scale_loss``, ``# Apex AMP backward``
   inside it): they kept apex's name, as the unwrapped block's lines counted as edited; they lose
   the label now, as comments above other rewritten lines do.
"""
import textwrap

from test_round17_shapes import migrated, run, write

RESUME = textwrap.dedent('''\
    import torch
    try:
        from apex import amp
        has_apex = True
    except ImportError:
        has_apex = False


    def main(args):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        use_amp = False
        if has_apex and args.amp:
            model, optimizer = amp.initialize(model, optimizer, opt_level='O1')
            use_amp = True
        if args.resume:
            resume_state = torch.load(args.resume)
            model.load_state_dict(resume_state['state_dict'])
            if use_amp and 'amp' in resume_state and 'load_state_dict' in amp.__dict__:
                amp.load_state_dict(resume_state['amp'])
        for _ in range(3):
            loss = model(torch.ones(2, 4, device="cuda")).sum()
            optimizer.zero_grad()
            if use_amp:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()
''')


def test_a_probe_of_apex_functions_folds_as_an_installed_test(tmp_path):
    out = migrated(tmp_path, {"train.py": RESUME}, "train.py")
    assert "amp.__dict__" not in out and "from apex" not in out and "has_apex" not in out
    assert "        if use_amp and 'amp' in resume_state:\n" in out
    assert "scaler.load_state_dict(_scaler_state(scaler, resume_state['amp']))" in out
    compile(out, "train.py", "exec")
    again = run(tmp_path)
    assert again.exit_code == 0 and "Would rewrite 0 files" in again.output


def test_hasattr_probe_folds_too(tmp_path):
    src = RESUME.replace("'load_state_dict' in amp.__dict__", "hasattr(amp, 'load_state_dict')")
    out = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "hasattr" not in out and "        if use_amp and 'amp' in resume_state:\n" in out


def test_a_probe_of_something_apex_may_lack_is_not_folded(tmp_path):
    # not one of apex.amp's own functions: what it asks is not whether apex is installed
    src = RESUME.replace("'load_state_dict' in amp.__dict__", "'_amp_state' in amp.__dict__")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "apex.amp.__dict__ has no automatic rewrite" in out.output
    assert "if use_amp and 'amp' in resume_state and '_amp_state' in amp.__dict__:" in out.output
    assert "+        if use_amp and 'amp' in resume_state:\n" not in out.output


SETUP = textwrap.dedent('''\
    import argparse
    import torch
    from apex import amp


    def setup(model, optimizer, opt):
        if opt.apex:
            if opt.apex_loss_scale != 'dynamic':
                apex_loss_scale = float(opt.apex_loss_scale)
            else:
                apex_loss_scale = 'dynamic'
            model, optimizer = amp.initialize(model, optimizer, opt_level=opt.apex_opt_level,
                                              loss_scale=apex_loss_scale)
        return model, optimizer


    def train(loader, model, optimizer, opt):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            if opt.apex:
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            optimizer.step()


    def main():
        p = argparse.ArgumentParser()
        p.add_argument('--apex', action='store_true')
        p.add_argument('--apex_opt_level', default='O1')
        p.add_argument('--apex_loss_scale', default='dynamic')
        opt = p.parse_args()
        model = torch.nn.Linear(4, 2).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = setup(model, optimizer, opt)
        train([(torch.ones(2, 4, device="cuda"), torch.zeros(2, dtype=torch.long, device="cuda"))],
              model, optimizer, opt)
''')


def test_a_loss_scale_chosen_by_a_branch_moves_to_the_callers(tmp_path):
    out = migrated(tmp_path, {"train.py": SETUP}, "train.py")
    # the choice, said in the caller: dynamic where the option says so, else static at that scale
    assert "init_scale=2.0**16 if opt.apex_loss_scale == 'dynamic' else float(opt.apex_loss_scale)," in out
    assert "growth_interval=2000 if opt.apex_loss_scale == 'dynamic' else 2**31 - 1," in out
    # the setup keeps nothing of the choice: the `if` went with the initialize
    assert "def setup(model, optimizer, opt):\n    return model, optimizer\n" in out
    assert "apex_loss_scale = " not in out
    compile(out, "train.py", "exec")
    again = run(tmp_path)
    assert again.exit_code == 0 and "Would rewrite 0 files" in again.output


def test_a_loss_scale_local_read_elsewhere_stays(tmp_path):
    # the name is logged after the initialize: the `if` that chose it stays, the callers still
    # say the choice themselves
    src = SETUP.replace("    return model, optimizer\n",
                        "        print(apex_loss_scale)\n    return model, optimizer\n", 1)
    out = migrated(tmp_path, {"train.py": src}, "train.py")
    assert "apex_loss_scale = float(opt.apex_loss_scale)" in out and "print(apex_loss_scale)" in out
    assert "init_scale=2.0**16 if opt.apex_loss_scale == 'dynamic' else float(opt.apex_loss_scale)," in out


def test_a_loss_scale_branch_that_calls_something_is_not_moved(tmp_path):
    # the value comes from a call the callers would run again (or not at all): refused as before
    src = SETUP.replace("float(opt.apex_loss_scale)", "compute_scale(opt)")
    write(tmp_path, {"train.py": src})
    out = run(tmp_path)
    assert "depends on `apex_loss_scale`, which its callers cannot see" in out.output


LISTED = textwrap.dedent('''\
    import torch
    from apex import amp


    def main(use_lif):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer_lif = torch.optim.SGD(model.parameters(), lr=0.01) if use_lif else None
        if optimizer_lif is not None:
            [model], [optimizer, optimizer_lif] = amp.initialize([model], [optimizer, optimizer_lif], opt_level="O1")
        else:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for _ in range(3):
            loss = model(torch.ones(2, 4, device="cuda")).sum()
            if optimizer_lif is not None:
                optimizer_list = [optimizer, optimizer_lif]
            else:
                optimizer_list = [optimizer]
            with amp.scale_loss(loss, optimizer_list) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
            if optimizer_lif is not None:
                optimizer_lif.step()
''')


def test_bfloat16_drops_an_optimizer_list_built_only_for_scale_loss(tmp_path):
    out = migrated(tmp_path, {"t.py": LISTED}, "t.py", "--dtype", "bfloat16")
    assert "optimizer_list" not in out and "loss.backward()" in out
    # the optimizers themselves stay: they step
    assert "optimizer.step()" in out and "optimizer_lif.step()" in out
    compile(out, "t.py", "exec")


def test_an_optimizer_list_read_elsewhere_stays(tmp_path):
    src = LISTED.replace("        optimizer.step()\n", "        print(len(optimizer_list))\n        optimizer.step()\n")
    assert src != LISTED
    out = migrated(tmp_path, {"t.py": src}, "t.py", "--dtype", "bfloat16")
    assert "optimizer_list = [optimizer, optimizer_lif]" in out and "print(len(optimizer_list))" in out


SWITCHED = textwrap.dedent('''\
    import contextlib

    import torch
    from apex import amp


    class Trainer:
        def __init__(self, model, optimizer, using_amp, using_apex_amp):
            self.model, self.optimizer = model, optimizer
            self.using_amp, self.using_apex_amp = using_amp, using_apex_amp
            self._scaler = torch.cuda.amp.GradScaler() if using_amp else None
            if using_apex_amp:
                self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O2")

        def step(self, x):
            with torch.cuda.amp.autocast() if self.using_amp else contextlib.nullcontext():
                loss = self.model(x).sum()
            if self.using_amp:
                loss = self._scaler.scale(loss)
            if self.using_apex_amp:
                with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                    scaled_loss.backward()
            else:
                loss.backward()
            if self.using_amp:
                self._scaler.step(self.optimizer)
                self._scaler.update()
            else:
                self.optimizer.step()
''')


def test_a_loss_from_a_native_autocast_switched_by_another_flag_is_refused(tmp_path):
    # the forward has a native region, enabled by the native path's flag: a region around what
    # follows would leave apex's path in float32 (sockeye's trainer: both paths, two flags)
    for extra in ((), ("--dtype", "bfloat16")):
        write(tmp_path, {"t.py": SWITCHED})
        out = run(tmp_path, *extra)
        # apex's part is left whole (the torch.cuda.amp spellings of the native path are still respelled)
        assert "-            self.model, self.optimizer = amp.initialize(" not in out.output, out.output
        assert "scale_loss" not in "".join(x for x in out.output.splitlines(True) if x.startswith("-"))
        assert "runs under a native autocast chosen by a condition" in out.output
        assert "join apex's condition to it by hand" in out.output


LABELLED = textwrap.dedent('''\
    import torch
    from apex import amp


    def main(use_apex):
        model = torch.nn.Linear(4, 4).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if use_apex:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for _ in range(3):
            loss = model(torch.ones(2, 4, device="cuda")).sum()
            if use_apex:
                # Apex AMP loss scaling
                with amp.scale_loss(loss, optimizer) as scaled:
                    # Apex AMP backward
                    scaled.backward()
            else:
                # PyTorch (with/without AMP) backward
                loss.backward()
            optimizer.step()
''')


def test_apex_labels_inside_a_collapsed_branch_go(tmp_path):
    out = migrated(tmp_path, {"t.py": LABELLED}, "t.py")
    assert not [line for line in out.splitlines() if line.lstrip().startswith("#") and "apex" in line.lower()]
    assert "        # AMP loss scaling\n        # AMP backward\n        scaler.scale(loss).backward()\n" in out
