"""The apex -> native AMP migration, planned over a whole project before anything is edited.

A *group* is everything that must change together: an ``amp.initialize`` (or several, when a
function that scales the loss is shared by several scripts), every ``amp.scale_loss``,
``amp.master_params`` and ``amp.state_dict`` that its scaler must reach, in any function or
module, the steps that follow a scaled backward, the forward passes that autocast must cover,
and the parameters and call sites that carry the scaler there.  A group is planned as a whole
and then tried on a copy: its output must parse and must not trip the checks that catch
hand-migration mistakes (a ``scaler.step`` with no scaled backward before it, a GradScaler
nothing uses, a backward inside autocast...).  A group that cannot be planned, or whose output
fails, is left whole in every file, and each of its files says why.

The entry point is :func:`ampfix.migration.planner.plan`; the groups are in :mod:`.groups`;
the planners are :mod:`.amp` (apex.amp), :mod:`.fp16` (FP16_Optimizer), :mod:`.functions`
(apex.amp's function-level API) and :mod:`.dual` (programs with an apex and a native path).
A planned rewrite is tried by the engine (``project.trial``: apply, parse, self-check).
"""
