"""Shapes met on the thirteenth round's repositories (microsoft/VideoX X-CLIP,
facebookresearch/multihop_dense_retrieval, alibaba/AliceMind, huawei-noah CAME's copy of
NVIDIA's BERT run_glue, and the Swin lineage read again in the side-by-side diff), as small
inline scripts; the runnable ones are fixtures (fixtures/apex/*.py, tests/test_migrate_fixtures.py)."""
import textwrap

from ampfix.engine.check import check_source
from ampfix.model.settings import Settings
from ampfix.registry import all_rules


def run(src):
    return check_source(textwrap.dedent(src).encode(), "x.py", all_rules(), Settings(), fix="safe")


def refusals(result):
    return [d.message for d in result.diagnostics if d.code.startswith("AMP10") and "not rewritten" in d.message]


# the Swin lineage: a gradient norm (not a clip) of apex's master gradients after every
# micro-batch of an accumulation: native AMP's gradients are still scaled there and unscale_ may
# run once per step, so the read runs with the gradients divided by the (power-of-two) scale
NORM_ON_MICRO_BATCHES = """\
    import torch
    from apex import amp


    def get_grad_norm(parameters):
        return sum(p.grad.norm().item() ** 2 for p in parameters if p.grad is not None) ** 0.5


    def train_one_epoch(model, criterion, optimizer, loader, accumulation_steps):
        for idx, (x, y) in enumerate(loader):
            outputs = model(x)
            if accumulation_steps > 1:
                loss = criterion(outputs, y) / accumulation_steps
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                grad_norm = get_grad_norm(amp.master_params(optimizer))
                if (idx + 1) % accumulation_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            else:
                loss = criterion(outputs, y)
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                grad_norm = get_grad_norm(amp.master_params(optimizer))
                optimizer.step()
        return grad_norm


    def main(model, optimizer, criterion, loader):
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        train_one_epoch(model, criterion, optimizer, loader, 2)
    """


def test_norm_on_micro_batches_reads_unscaled_gradients_without_unscaling_each_step():
    fixed = run(NORM_ON_MICRO_BATCHES).fixed
    lines = [x.strip() for x in fixed.splitlines()]
    at = lines.index("with _unscaled_grads(scaler, optimizer):")
    assert lines[at + 1].startswith("grad_norm = get_grad_norm("), fixed
    assert lines.count("scaler.unscale_(optimizer)") == 1  # the branch that steps every time
    assert "get_scale()" not in fixed and "import contextlib" in fixed


def test_norm_on_micro_batches_refuses_with_a_static_loss_scale():
    src = NORM_ON_MICRO_BATCHES.replace('opt_level="O1")', 'opt_level="O1", loss_scale=1000.0)')
    result = run(src)
    assert result.fixed == textwrap.dedent(src)
    assert any("read on micro-batches where the optimizer does not step" in m for m in refusals(result))


def test_a_step_in_each_branch_gets_its_update():
    src = NORM_ON_MICRO_BATCHES.replace("get_grad_norm(amp.master_params(optimizer))", "0.0")
    fixed = run(src).fixed
    lines = [x.strip() for x in fixed.splitlines()]
    steps = [i for i, x in enumerate(lines) if x == "scaler.step(optimizer)"]
    assert len(steps) == 2
    assert all(lines[i + 1] == "scaler.update()" for i in steps), fixed
    # the forward before the branch runs under autocast, in a region of its own
    at = lines.index("outputs = model(x)")
    assert lines[at - 1].startswith("with torch.autocast("), fixed


# NVIDIA's BERT run_glue: the unpacked initialize is a seed only where the optimizer handed in is
# None on the side that unpacks None
UNPACK = """\
    import torch
    from apex import amp


    def setup(model, steps, use_fp16, optimizer=None):
        if use_fp16:
            {make}
            inits = amp.initialize(model, optimizers=optimizer, opt_level="O1")
            model, optimizer = (inits if steps is not None else (inits, None))
        return model, optimizer


    def main(args, model, batches):
        model, optimizer = setup(model, args.steps, args.fp16)
        for x in batches:
            loss = model(x).sum()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
    """


def test_unpacked_initialize_migrates_where_the_optimizer_follows_the_same_test():
    src = UNPACK.replace("{make}", "if steps is not None:\n                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    result = run(src)
    assert "from apex" not in result.fixed and "amp.initialize" not in result.fixed and "inits" not in result.fixed
    assert "scaler.step(optimizer)" in result.fixed


def test_unpacked_initialize_refuses_where_the_optimizer_may_be_set_on_the_other_side():
    src = UNPACK.replace("{make}", "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)")
    result = run(src)
    assert result.fixed == textwrap.dedent(src)
    assert any("cannot tell that the optimizer handed in is None" in m for m in refusals(result))


# an evaluation helper gets autocast where it is called after the seed; one that trains does not
EVAL = """\
    import torch
    from apex import amp


    def evaluate(model, x):
        model.eval()
        with torch.no_grad():
            return model(x).sum()


    def finetune(model, optimizer, x):
        loss = model(x).sum()
        loss.backward()
        optimizer.step()


    def main(model, optimizer, x, fp16):
        if fp16:
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        for _ in range(3):
            loss = model(x).sum()
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
            optimizer.step()
        score = evaluate(model, x)
        finetune(model, optimizer, x)
        return score
    """


def test_evaluation_after_training_runs_under_autocast_and_training_helpers_do_not():
    fixed = run(EVAL).fixed
    lines = [x.strip() for x in fixed.splitlines()]
    at = lines.index("score = evaluate(model, x)")
    assert lines[at - 1] == 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16)):', fixed
    at = lines.index("finetune(model, optimizer, x)")
    assert not lines[at - 1].startswith("with torch.autocast"), fixed


# lonePatient's trainer: apex's amp imported inside __init__, used as a global in another method
UNBOUND = """\
    import torch


    class Trainer:
        def __init__(self, args, model, optimizer):
            self.args, self.model, self.optimizer = args, model, optimizer
            if args.fp16:
                from apex import amp
                self.model, self.optimizer = amp.initialize(model, optimizer, opt_level="O1")

        def train_epoch(self, batches):
            for x in batches:
                loss = self.model(x).sum()
                if self.args.fp16:
                    with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                self.optimizer.step()
    """


def test_scale_loss_on_an_unbound_amp_migrates_and_says_the_fp16_path_raised_before():
    # the read raised NameError: the name has no other meaning to keep, so it is the apex amp
    # that the same module imports inside `__init__` (the fp16 path now runs native AMP)
    result = run(UNBOUND)
    fixed = result.fixed
    assert "amp." not in fixed.replace("torch.amp.", ""), fixed
    assert "self.scaler.scale(loss).backward()" in fixed and "self.scaler.step(self.optimizer)" in fixed
    assert "with torch.autocast(" in fixed
    compile(fixed, "trainer.py", "exec")
    assert not refusals(result), refusals(result)
    notes = " ".join(result.applied)
    assert "x.py line 15 read a name that only an import inside another function binds" in notes, notes
    assert "raised NameError there before, and runs now" in notes, notes


def test_an_unbound_name_is_apex_only_where_every_inner_import_says_so():
    from ampfix.model.semantic import Model
    import ast
    src = textwrap.dedent("""\
        def a():
            from apex import amp
        def b():
            from torch.cuda import amp
        def c():
            amp.scale_loss
            ddp.Foo
        def d():
            from apex.parallel import DistributedDataParallel as ddp
    """)
    tree = ast.parse(src)
    sem = Model(tree)
    attrs = {n.value.id: n for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert sem.qnames(attrs["amp"]) == set()  # two imports disagree: no meaning guessed
    assert sem.qnames(attrs["ddp"]) == {"apex.parallel.DistributedDataParallel.Foo"}


# multihop_dense_retrieval's train_mhop: `if do_train: initialize(model, optimizer) else:
# initialize(model)`: the evaluation after both runs under either's condition
BOTH = """\
    import torch
    from apex import amp


    def predict(model, x):
        model.eval()
        with torch.no_grad():
            return model(x).sum()


    def main(args, model, x):
        if args.do_train:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            if args.fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        else:
            if args.fp16:
                model = amp.initialize(model, opt_level="O1")
        if args.do_train:
            for _ in range(3):
                loss = model(x).sum()
                if args.fp16:
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                else:
                    loss.backward()
                optimizer.step()
        return predict(model, x)
    """


def test_evaluation_after_a_train_or_predict_choice_gets_both_conditions():
    fixed = run(BOTH).fixed
    lines = [x.strip() for x in fixed.splitlines()]
    at = lines.index("return predict(model, x)")
    assert lines[at - 1] == 'with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):', fixed
