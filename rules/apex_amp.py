"""AMP101: apex.amp, reported and rewritten to native torch.amp as one all-or-nothing fix."""

from ampfix.migration.planner import plan as migration_plan
from ampfix.rule import Invalid, Valid
from ampfix.rules._apex import ApexRule


class ApexAmp(ApexRule):
    """
    ## What it does
    Reports every use of `apex.amp` (`initialize`, `scale_loss`, `master_params`,
    `state_dict`, `load_state_dict`, ...) and rewrites a module that uses it to native AMP:

    * `model, opt = amp.initialize(model, opt, opt_level="O1", ...)` becomes
      `scaler = torch.amp.GradScaler("cuda")` (or `self.scaler` when initialize runs in one
      method and the step in another of the same class, or a module global, declared
      `global scaler`, when initialize runs in `main()` and the step in `train()`; autocast
      there follows `scaler.is_enabled()`).  `O0` / `enabled=False` give
      `enabled=False` on the scaler and autocast; a non-literal `opt_level` gives
      `enabled=<opt_level> != "O0"`; a numeric `loss_scale` gives `init_scale=` and no growth;
      the other options are mapped or named in the fix's description, never dropped silently.
    * The statements that compute the scaled loss (found by data flow back from the loss, in
      its block, stopping at an earlier backward or step) are wrapped in
      `with torch.autocast("cuda", dtype=torch.float16):`; backward stays outside.
    * `with amp.scale_loss(loss, opt) as s: s.backward()` becomes `scaler.scale(loss).backward()`;
      `opt.step()` becomes `scaler.step(opt)`, and `scaler.update()` follows the last step of the
      function, once (several optimizers and `loss_id`s share one scaler; `delay_unscale` is
      not needed).
    * `clip_grad_norm_(amp.master_params(opt), ...)` becomes `scaler.unscale_(opt)` and clipping
      of the optimizer's parameters; `amp.state_dict()` / `amp.load_state_dict()` become the
      scaler's.
    * A guard `if args.fp16: model, opt = amp.initialize(...)` becomes an unconditional scaler
      with `enabled=args.fp16`, and `if args.fp16: <scaled backward> else: loss.backward()`
      becomes the scaled backward alone: no dead apex path is left.

    * A trainer that scales the loss under its own switch (`if self.use_amp:`, or the switch
      passed down to a backward helper) while a setup elsewhere initializes apex and hands the
      optimizer out: apex raised in `scale_loss` unless initialized, so the switch meant "AMP
      on".  The scaler is made in `__init__` right where the switch is set, enabled by it, and
      the setup's initialize goes.  A switch combined with another condition, or set again
      outside `__init__`, is not trusted: the module is left whole.

    * An optimizer hook that a registry builds from the configuration (mmcv's
      `DistOptimizerHook(use_fp16=...)`), with apex initialized in the train API that hands the
      optimizer to the framework's runner: the hook makes the scaler where `use_fp16` is set,
      the train API's initialize goes, and the forward stays under autocast through the
      framework's `fp16_enabled` flag that the same block sets (mmcv's `auto_fp16`, mmcv 1.3 or
      newer); without that flag the project is left whole.  A runner or checkpoint helper that
      saved apex's state cannot reach a scaler in such a hook: that state goes (a resumed run
      starts from the initial scale).

    * `O3` (pure float16) becomes `model = model.half()` plus a forward pre-hook that casts
      floating-point inputs to float16, as apex did; the backward is plain and the fix
      description says the model is pure float16 (no master weights, no loss scaling).  O3
      with a loss scale is refused: GradScaler cannot unscale float16 gradients.

    With `target = "torch.cuda.amp"` the same rewrite uses `torch.cuda.amp.GradScaler()` and
    `torch.cuda.amp.autocast(dtype=torch.float16)`.

    When a part cannot be rewritten with confidence (a use of `apex.amp` not listed above,
    a loss computed in another function, a scaler that cannot reach the step), nothing of
    `apex.amp` is rewritten in that module and the report says why.

    ## Why is this bad?
    apex.amp monkey-patches torch functions (O1) or keeps its own master weights (O2), must be
    built against the exact torch and CUDA, and is in maintenance mode.  Native AMP does the
    same job with `torch.autocast` and `GradScaler`, with fewer casts and no patching.

    ## Example
    ```python
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```
    """

    code = "AMP101"
    name = "apex-amp"
    summary = "apex.amp: use torch.autocast + torch.amp.GradScaler (rewritten by migrate)"
    fix_kind = "safe"
    since = "1.6"
    prefix = "apex.amp"
    #: the whole-project migration (ampfix.migration) plans this rule's fixes
    planner = staticmethod(migration_plan)
    #: the planner's own reports of these migrations (a file edited without apex use) are this rule's
    says_plan_reports = ("apex.amp", "dual")

    VALID = [Valid("import torch\nscaler = torch.amp.GradScaler('cuda')\n"),
             Valid("from mylib import amp\nmodel = amp.initialize(model)\n")]
    INVALID = [
        Invalid(
            """
            import torch
            from apex import amp

            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)  # the loss
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    out = model(x)
                    loss = criterion(out, y)  # the loss
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            # initialize in one branch of an if/elif chain (§1.4): the scaler is made before the
            # chain, enabled where that branch runs; the `else: raise` stays in the chain
            """
            import torch
            from apex import amp


            def train(args, model, optimizer, loader):
                if args.mode == "fp32":
                    pass
                elif args.mode == "apex":
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                else:
                    raise ValueError(args.mode)
                for batch in loader:
                    loss = model(batch)
                    if args.mode == "apex":
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()
            """,
            count=2,
            expected="""
            import torch


            def train(args, model, optimizer, loader):
                scaler = torch.amp.GradScaler("cuda", enabled=args.mode != "fp32")
                if args.mode == "fp32":
                    pass
                elif args.mode != "apex":
                    raise ValueError(args.mode)
                for batch in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=args.mode != "fp32"):
                        loss = model(batch)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
        ),
        Invalid(
            # the trainer's own switch (§1.2): scale_loss under `if self.use_amp:`, initialize in
            # a setup that hands the optimizer out and nothing carries a value between them; apex
            # raised in scale_loss unless initialized, so the switch meant "AMP on": the scaler is
            # made where __init__ sets it, and the setup's initialize goes
            """
            import torch
            from apex import amp


            def build(model, use_amp):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                if use_amp:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                return model, optimizer


            class Trainer:
                def __init__(self, model, optimizer, use_amp):
                    self.model, self.optimizer = model, optimizer
                    self.use_amp = use_amp

                def step(self, x):
                    loss = self.model(x).sum()
                    if self.use_amp:
                        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    self.optimizer.step()


            def setup(args):
                return build(torch.nn.Linear(4, 1), args.fp16)


            def main(args):
                model, optimizer = setup(args)
                Trainer(model, optimizer, args.fp16).step(torch.randn(2, 4))
            """,
            count=2,
            expected="""
            import torch


            def build(model, use_amp):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                return model, optimizer


            class Trainer:
                def __init__(self, model, optimizer, use_amp):
                    self.model, self.optimizer = model, optimizer
                    self.use_amp = use_amp
                    self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.use_amp))

                def step(self, x):
                    with torch.autocast(
                        "cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()
                    ):
                        loss = self.model(x).sum()
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()


            def setup(args):
                return build(torch.nn.Linear(4, 1), args.fp16)


            def main(args):
                model, optimizer = setup(args)
                Trainer(model, optimizer, args.fp16).step(torch.randn(2, 4))
            """,
        ),
        Invalid(
            # initialize in main(), the step in train(): the scaler is passed to train()
            """
            from apex import amp

            def train(model, loader, optimizer):
                for x, y in loader:
                    loss = criterion(model(x), y)
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                    optimizer.step()

            def main(args):
                model, optimizer = build()
                if args.fp16:
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                train(model, loader, optimizer)
            """,
            count=2,
            expected="""
            import torch

            def train(model, loader, optimizer, *, scaler):
                for x, y in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):
                        loss = criterion(model(x), y)
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()

            def main(args):
                model, optimizer = build()
                scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))
                train(model, loader, optimizer, scaler=scaler)
            """,
        ),
        Invalid(
            # the shape of the Hugging Face example scripts: the import and initialize under
            # one guard; the scaler is hoisted out of it, and the guard goes once empty
            """
            import torch

            def train(args, model, optimizer, loader):
                if args.fp16:
                    try:
                        from apex import amp
                    except ImportError:
                        raise ImportError("Please install apex")
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
                for batch in loader:
                    loss = model(**batch)[0]
                    if args.fp16:
                        with amp.scale_loss(loss, optimizer) as scaled_loss:
                            scaled_loss.backward()
                    else:
                        loss.backward()
                    optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            def train(args, model, optimizer, loader):
                scaler = torch.amp.GradScaler("cuda", enabled=bool(args.fp16))
                for batch in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):
                        loss = model(**batch)[0]
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
        ),
        Invalid(
            # ViT-pytorch and its many copies set the first loss scale through apex's private state
            """
            from apex import amp
            if args.fp16:
                model, optimizer = amp.initialize(models=model, optimizers=optimizer, opt_level="O2")
                amp._amp_state.loss_scalers[0]._loss_scale = 2**20
            for x, y in loader:
                loss = model(x, y)
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
            """,
            count=3,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda", init_scale=2**20, enabled=bool(args.fp16))
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.fp16)):
                    loss = model(x, y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            # initialize under an if/else: the scaler is made before it, enabled when the if is
            """
            from apex import amp
            if args.amp:
                model, optimizer = amp.initialize(model, optimizer)
            else:
                model = model.float()
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
                optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            scaler = torch.amp.GradScaler("cuda", enabled=bool(args.amp))
            if not args.amp:
                model = model.float()
            for x in loader:
                with torch.autocast("cuda", dtype=torch.float16, enabled=bool(args.amp)):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Invalid(
            # a trainer with no __init__ of its own: the disabled scaler is a class attribute
            """
            from apex import amp

            class AmpTrainer(BaseTrainer):
                def setup(self):
                    if self.cfg.fp16:
                        self.model, self.optimizer = amp.initialize(self.model, self.optimizer)

                def step(self, x):
                    loss = self.model(x)
                    with amp.scale_loss(loss, self.optimizer) as scaled:
                        scaled.backward()
                    self.optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            class AmpTrainer(BaseTrainer):
                scaler = torch.amp.GradScaler("cuda", enabled=False)

                def setup(self):
                    self.scaler = torch.amp.GradScaler("cuda", enabled=bool(self.cfg.fp16))

                def step(self, x):
                    with torch.autocast(
                        "cuda", dtype=torch.float16, enabled=self.scaler.is_enabled()
                    ):
                        loss = self.model(x)
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
        ),
        Invalid(
            # a backward helper scales the loss; its caller steps: the caller's step is the scaler's
            """
            from apex import amp

            def backward(loss, optimizer):
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()

            def main(model, opt, loader):
                model, opt = amp.initialize(model, opt, opt_level="O1")
                for x in loader:
                    loss = model(x)
                    opt.zero_grad()
                    backward(loss, opt)
                    opt.step()
            """,
            count=2,
            expected="""
            import torch

            def backward(loss, optimizer, *, scaler):
                scaler.scale(loss).backward()

            def main(model, opt, loader):
                scaler = torch.amp.GradScaler("cuda")
                for x in loader:
                    with torch.autocast("cuda", dtype=torch.float16):
                        loss = model(x)
                    opt.zero_grad()
                    backward(loss, opt, scaler=scaler)
                    scaler.step(opt)
                    scaler.update()
            """,
        ),
        Invalid(
            # the loss scale is computed under the flag, right before initialize: the scaler is
            # made there, a disabled one before the `if`, and autocast follows the scaler
            """
            from apex import amp

            def main(args, model, optimizer, loader):
                if args.amp:
                    loss_scale = None if args.dynamic else args.scale
                    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", loss_scale=loss_scale)
                for x, y in loader:
                    loss = model(x, y)
                    optimizer.zero_grad()
                    with amp.scale_loss(loss, optimizer) as scaled:
                        scaled.backward()
                    optimizer.step()
            """,
            count=2,
            expected="""
            import torch

            def main(args, model, optimizer, loader):
                scaler = torch.amp.GradScaler("cuda", enabled=False)
                if args.amp:
                    loss_scale = None if args.dynamic else args.scale
                    scaler = torch.amp.GradScaler(
                        "cuda",
                        init_scale=2.0**16 if loss_scale in (None, 0, "dynamic") else float(loss_scale),
                        growth_interval=2000 if loss_scale in (None, 0, "dynamic") else 2**31 - 1,
                    )
                for x, y in loader:
                    with torch.autocast("cuda", dtype=torch.float16, enabled=scaler.is_enabled()):
                        loss = model(x, y)
                    optimizer.zero_grad()
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
        ),
        Invalid(
            # an optimizer that amp.initialize returns but nothing scales: training runs unscaled
            """
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            train(model, optimizer)
            """,
            message="never used with amp.scale_loss",
        ),
        Invalid(
            # an evaluation script that kept its trainer's initialize: nothing reads the optimizer
            # after it and nothing runs a backward, so apex only cast the forward passes
            """
            from apex import amp

            def main(cfg, model, optimizer, loader):
                model, optimizer = amp.initialize(model, optimizer, opt_level=cfg.opt_level)
                model.eval()
                results = evaluate(model, loader)
                print(results)
            """,
            expected="""
            import torch

            def main(cfg, model, optimizer, loader):
                model.eval()
                with torch.autocast("cuda", dtype=torch.float16, enabled=cfg.opt_level != "O0"):
                    results = evaluate(model, loader)
                print(results)
            """,
        ),
        Invalid(
            """
            from apex import amp as A
            model, opt = A.initialize(model, opt, opt_level="O3")
            for x, y in loader:
                loss = criterion(model(x), y)
                with A.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            """,
            count=2,
            message="O3 is pure float16",
            expected="""
            import torch

            model = model.half()
            model.register_forward_pre_hook(lambda module, args: tuple(
                a.half() if torch.is_tensor(a) and a.is_floating_point() else a for a in args))
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
            """,
        ),
        Invalid(
            """
            from apex import amp
            model, opt = amp.initialize(model, opt, opt_level="O2", loss_scale=128.0)
            for x, y in loader:
                loss = criterion(model(x), y)
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            """,
            count=2,
            settings={"target": "torch.cuda.amp"},
            expected="""
            import torch

            scaler = torch.cuda.amp.GradScaler(init_scale=128.0, growth_interval=2**31 - 1)
            for x, y in loader:
                with torch.cuda.amp.autocast(dtype=torch.float16):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(
            # the project runs torch 1.13: torch.amp.GradScaler does not exist there (2.3)
            """
            from apex import amp
            model, opt = amp.initialize(model, opt)
            for x in loader:
                loss = model(x)
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                opt.step()
            """,
            count=2,
            settings={"torch_version": "1.13"},
            expected="""
            import torch

            scaler = torch.cuda.amp.GradScaler()
            for x in loader:
                with torch.cuda.amp.autocast(dtype=torch.float16):
                    loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(
            # statements joined by `;`, and the clip of the parameters the optimizer was built from
            """
            import torch
            from apex import amp
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            net, opt = amp.initialize(net, opt, opt_level="O1")
            for x in loader:
                loss = net(x).sum()
                with amp.scale_loss(loss, opt) as scaled:
                    scaled.backward()
                torch.nn.utils.clip_grad_norm_(amp.master_params(opt), 1.0); opt.step()
            """,
            count=3,
            expected="""
            import torch
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = net(x).sum()
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0); scaler.step(opt)
                scaler.update()
            """,
        ),
        Invalid(
            # the fp16 branch stays (its fp32 twin does more than clip) and imports apex in a try:
            # its clip on every micro-batch stays there, on the scaled gradients, through a helper
            # that divides their norm by the scale on the device (the same clip, no host copy)
            """
            import torch
            from apex import amp
            if fp16:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for step, batch in enumerate(loader):
                loss = model(batch) / accum
                if fp16:
                    try:
                        from apex import amp
                    except ImportError:
                        raise ImportError("install apex")
                    with amp.scale_loss(loss, optimizer) as scaled_loss:
                        scaled_loss.backward()
                    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), max_norm)
                else:
                    loss.backward()
                    total_norm += torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if (step + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            count=3,
            expected="""
            import torch
            scaler = torch.amp.GradScaler("cuda", enabled=bool(fp16))


            def _clip_scaled_grad_norm_(scaler, parameters, max_norm, norm_type=2.0):
                \"\"\"clip_grad_norm_ of gradients that the GradScaler has not unscaled yet, without
                copying the scale to the host.\"\"\"
                grads = [p.grad for p in parameters if p.grad is not None]
                if not grads:
                    return torch.tensor(0.0)
                device = grads[0].device
                norms = [torch.linalg.vector_norm(g, norm_type).to(device) for g in grads]
                norm = torch.linalg.vector_norm(torch.stack(norms).float(), norm_type)
                norm = norm / scaler.scale(torch.ones_like(norm))
                coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
                for g in grads:
                    g.mul_(coef.to(g.device))
                return norm


            for step, batch in enumerate(loader):
                with torch.autocast("cuda", dtype=torch.float16, enabled=bool(fp16)):
                    loss = model(batch) / accum
                if fp16:
                    scaler.scale(loss).backward()
                    _clip_scaled_grad_norm_(scaler, model.parameters(), max_norm)
                else:
                    loss.backward()
                    total_norm += torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if (step + 1) % accum == 0:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
            """,
        ),
        Invalid(
            """
            from apex import amp
            model, opt = amp.initialize(model, opt, opt_level="O3", loss_scale="dynamic")
            """,
            message="O3 with loss scaling",
        ),
        Invalid(
            """
            from apex import amp
            def train(loss, optimizer):
                with amp.scale_loss(loss, optimizer) as s:
                    s.backward()
                optimizer.step()
            """,
            # nothing calls it: it would take the scaler as `scaler=`, but the loss's forward pass
            # is in callers the project does not have
            message="whose callers cannot all be followed",
        ),
    ]


