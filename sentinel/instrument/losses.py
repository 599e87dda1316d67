"""The step's loss, taken where the script hands it to autograd: ``Tensor.backward``.

Zero-code mode (``sentinel run``) and monitors made with ``capture_loss=True`` (the HF
Trainer adapter) read the loss here. The loss of an optimizer step is the **sum** of the
scalar losses passed to ``backward()`` since the previous step of any optimizer (with two
optimizers, as in a GAN, each step gets the losses of its own backward() calls; optimizers
stepped one after another after the same ``backward()``, as a sparse table's SparseAdam and
a dense head's Adam, each get its loss), each divided by the
``GradScaler`` scale when the scaler scaled it, or by a loss scaler's of the script's own
(:func:`hand_scale`: apex's amp, fairseq, DeepSpeed's fp16). With gradient accumulation, scripts and
frameworks divide each micro-batch loss by the number of micro-batches before
``backward()`` (HF Trainer, Accelerate, Lightning), so the sum is the step's mean loss,
which is what they log; a script that does not divide gets the sum of its micro-batches.
When a step has more ``backward()`` calls than the first step had (YOLOv5's and
Ultralytics' accumulation grows from 1 to 64 / batch size micro-batches during their warmup,
on losses not divided), the reporter puts the sum in the first step's units
(``sum × first count / count``), so a step of more micro-batches is no rise of the loss;
:meth:`LossSum.take` keeps the count it summed. A step with fewer (an epoch's last, shorter
accumulation) keeps its sum: the HF Trainer divides those losses by their own count, so
their sum is the step's mean already (a script that divides by its nominal count shows a
dip there, as before).

Only a single-element tensor that requires grad counts as a loss (a ``backward(gradient)``
on a non-scalar is not one; a single element's gradient multiplies it), and
``torch.autograd.backward([loss_a, loss_b])`` counts their sum. The sum stays on the
loss's device: adding is one small kernel, never a read-back. A closure optimizer (LBFGS)
calls its closure several times per step; :meth:`LossSum.freeze` keeps the first
evaluation's loss, the one ``step()`` returns.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import weakref
from typing import Any

import torch
from torch.overrides import has_torch_function_unary

from sentinel.instrument import profiled

log = logging.getLogger("sentinel")

_sums: weakref.WeakSet[LossSum] = weakref.WeakSet()
_installed = False
_scaler: Any = None  # the GradScaler that scaled the last loss, if any
_scaled: weakref.ref[torch.Tensor] | None = None  # the loss it scaled (no attribute on the user's tensor)
_failures = 0
_local = threading.local()  # this thread's backward() count, and its last step's losses (claimed)
_claims = itertools.count(1)  # the steps' claims, numbered in order, process-wide
_latest_start: dict[int, int] = {}  # per thread, the claim with which its last training to begin stepping began


def calls() -> int:
    """``backward()`` calls so far in this thread (once :func:`install` ran). A training's
    own: threads that each train a model of their own (Optuna's ``n_jobs`` trials, a web
    UI's training threads) count apart, as their steps, losses and reports are apart."""
    return getattr(_local, "calls", 0)


_depth: dict[int, int] = {}
"""Per thread in a ``backward()`` now: how deep (Tensor.backward's own call of
torch.autograd.backward, a re-entrant checkpoint's during the pass). Per thread: another
thread's backward() is another training's (trials in threads)."""


def caller() -> int:
    """The thread of the training that runs this code: this one, or, in autograd's device
    thread (a thread Python did not start, running a CUDA backward's hooks: an optimizer
    stepped as soon as its parameter's gradient is ready), the one thread inside a
    ``backward()`` now."""
    me = threading.get_ident()
    if me in _depth or len(_depth) != 1 or not isinstance(threading.current_thread(), _DUMMY):
        return me
    return next(iter(_depth))


_DUMMY = getattr(threading, "_DummyThread", ())


def mine(thread: int | None, me: int | None = None) -> bool:
    """Whether a sum or listener of a training that steps in ``thread`` (None: not known
    yet) is concerned by a ``backward()``, a step or a clipping of thread ``me`` (this one
    by default)."""
    return thread is None or thread == (threading.get_ident() if me is None else me)


backward_listeners: weakref.WeakSet[Any] = weakref.WeakSet()
"""Objects whose ``before_backward(loss)`` runs at each ``backward()`` call, before autograd
(monitors sending a report that nothing more can arrive for), and, if they have one,
``after_backward()`` once it returned (a monitor of parameters updated by hand reads the
gradients there). Neither may raise."""


class LossSum:
    """The losses passed to ``backward()`` since the last :meth:`take`, summed on the device.

    With :meth:`watch`, a ``backward()`` that finds the watched parameter's gradient reset
    (None, or the tensor the last ``backward()`` left with another version: zeroed in place)
    after it was seen set during this step's earlier ``backward()`` calls starts the sum
    again: their gradients were thrown away, so the step applies none of theirs. The step's loss is
    that of the passes whose gradients it applies: an adversarial training step's pass on
    the perturbed batch, not its attack's passes; SAM's second pass (at the perturbed
    weights), not its first. Micro-batches accumulate their gradients and sum.

    Unless the gradient the step finds is not the one the last ``backward()`` left: then the
    script made it itself, from what it kept of every pass (gradient surgery: PCGrad takes
    each task's gradients in a ``backward()`` of its own between resets, and sets the
    projected combination), and the step's loss is the sum over all of them.

    Passes thrown away whose loss, or the gradient norm ``clip_grad_norm_`` took of them,
    was not finite are counted (:attr:`skipped`): a script that skips its step on a NaN
    (``loss.backward()``, then ``if not torch.isfinite(loss): continue``, or the same test
    of the clipped norm) leaves nothing else to see, as no step reports it.
    Losses a loss scaler scaled are not counted: its skipped steps are its overflows (a
    ``GradScaler`` reports them itself)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0
        self.taken = 0
        """How many losses the last :meth:`take` or :meth:`claim` summed."""
        self.frozen = False
        self._param: weakref.ref[torch.Tensor] | None = None
        self._filling = False  # this backward() found the gradient unset: it may fill it
        self.filled = False  # the watched gradient was seen set during this step's backward() calls
        self._dropped: tuple[torch.Tensor, int] | None = None  # the losses of passes whose gradients were reset
        # once passes were reset: the watched parameter, and the gradient the last backward() left it (or None)
        self._left: tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor] | None] | None = None
        # the gradient tensor the last backward() left, and its version counter: the same tensor with
        # another version at the next backward() was zeroed in place (zero_grad(set_to_none=False))
        self._after: tuple[weakref.ref[torch.Tensor], int] | None = None
        self._claimed: tuple[int, int] | None = None  # the thread and number of its last step's claim
        self.skipped: torch.Tensor | None = None
        """Resets that threw away passes with a non-finite loss or norm, so far: a running count on
        the losses' device (a small kernel or two per such reset; never read here)."""
        self._bad: torch.Tensor | None = None  # this step's resets that threw away a non-finite loss
        self._scaled = False  # a loss scaler scaled a loss of the passes since the last reset
        self._grad_scaler: weakref.ref[Any] | None = None  # the GradScaler that scaled one of its losses
        self._hand = False  # a loss scaler of the script's own scaled one of its losses (hand_scale)
        self._norm: torch.Tensor | None = None  # the gradient norm clip_grad_norm_ took since the last reset
        self.thread: int | None = None
        """The thread of its training: a monitor's sets it (the thread that made the monitor,
        then the one its optimizer steps in: ``Monitor.stepped_in``); zero-code mode's early
        sum takes the thread of its first loss. A ``backward()`` of another thread is another
        training's (threads that each train a model of their own), whose gradients it must
        not read while that thread's autograd may be writing them: that race corrupted the heap."""
        install()
        _sums.add(self)

    def grad_scaler(self) -> Any:
        """The ``GradScaler`` that scaled a loss of this sum's training, once one did, or None.
        Its own training's: a ``GradScaler`` of an earlier training of the process (an AMP
        trial before this one, a notebook's earlier cell) is not this one's."""
        return self._grad_scaler() if self._grad_scaler is not None else None

    def watch(self, param: torch.Tensor | None) -> None:
        """Tell apart accumulation (gradients summed over backward() calls) from passes whose
        gradients are thrown away (reset before the next) by this parameter's gradient."""
        self._param = weakref.ref(param) if param is not None else None

    def add(self, loss: torch.Tensor, scaled: bool = False, grad_scaler: Any = None,
            hand: float | None = None) -> None:
        """A ``backward()``'s loss (``scaled``: a ``GradScaler`` scaled it, ``grad_scaler``;
        ``hand``: the power of two it was last multiplied by, :func:`hand_scale`). A loss
        scaler's skipped steps are its overflows, no fault of the training. A loss multiplied
        by a power of two of at least :data:`HAND_SCALE_MIN` is a loss scaler's, and from
        then on every power of two it is multiplied by (a dynamic scale halves at each
        overflow, fairseq's down to 1e-4) is divided out."""
        if grad_scaler is not None:
            self._grad_scaler = weakref.ref(grad_scaler)
        if hand is not None and (self._hand or hand >= HAND_SCALE_MIN):
            self._hand = True
            loss = loss / hand  # on the loss's device: no sync
            scaled = True
        if self.frozen:
            return
        p = self._param() if self._param is not None else None
        if p is not None:
            g = p.grad
            after = self._after
            if g is None or (after is not None and after[0]() is g and g._version != after[1]):  # no sync
                # unset, or zeroed in place since the last backward()
                if self.filled:  # reset since it was seen set in this step: the passes before are gone
                    if self.total is not None:  # ... unless the step's gradient is made of them (take)
                        d = self._dropped
                        self._dropped = (self.total, self.count) if d is None else (
                            d[0] + self.total.to(d[0].device), d[1] + self.count)
                        if not self._scaled:  # a loss scaler's skipped steps are its overflows (amp)
                            self._bad = _nonfinite(self.total, self._norm, self._bad)
                    self.total, self.count, self.filled, self._scaled, self._norm = None, 0, False, False, None
                self._filling = True
            else:  # set: by an earlier pass of this step, or left from the last step's
                self.filled = True
        self.total = loss if self.total is None else self.total + loss.to(self.total.device)
        self.count += 1
        self._scaled = self._scaled or scaled

    def after(self) -> None:
        """After a backward(): whether it filled the watched gradient, which tensor it left
        (and its version), and, once a pass was reset in this step, which gradient it left."""
        p = self._param() if self._param is not None else None
        g = p.grad if p is not None else None
        self._after = (weakref.ref(g), g._version) if g is not None and g.layout == torch.strided else None
        if not (self._filling or self._dropped is not None):
            return
        if self._filling:
            self._filling = False
            self.filled = p is not None and p.grad is not None
        if self._dropped is not None and p is not None:
            self._left = (weakref.ref(p), None if p.grad is None else weakref.ref(p.grad))

    def freeze(self) -> None:
        """Ignore further losses until the next :meth:`take` (closure re-evaluations)."""
        self.frozen = True

    def take(self) -> torch.Tensor | None:
        """The sum since the last take (None if nothing was passed to backward), and reset;
        with the passes whose gradients were reset when the step's gradient is not the one
        the last backward() left (the script combined theirs)."""
        total, count, dropped, left = self.total, self.count, self._dropped, self._left
        if dropped is not None and total is not None and left is not None:
            p = left[0]()  # the parameter watched then (a zero-code monitor watches its own from its first step)
            if p is not None and p.grad is not None and (left[1] is None or left[1]() is not p.grad):
                total, count = dropped[0] + total.to(dropped[0].device), dropped[1] + count
                dropped = None  # the step applies them
        if dropped is not None:
            self._count_skipped()
        self._bad = self._norm = None
        self.total, self.taken, self.count, self.frozen, self._scaled = None, count, 0, False, False
        self.filled = self._filling = False
        self._dropped = self._left = None
        return total

    def claim(self) -> torch.Tensor | None:
        """:meth:`take`, for an optimizer step: the losses since any optimizer last stepped
        are this step's, so every other sum forgets them (a GAN's discriminator step gets
        its own two losses, the generator's step the generator's). A step with no
        ``backward()`` since another optimizer's step applies the gradients of that step's
        ``backward()`` calls (one loss filled both optimizers' gradients): their losses."""
        total = self.take()
        claimed = getattr(_local, "claimed", None)  # this thread's last step's losses
        if total is None and claimed is not None and claimed[0] == calls():
            self.taken = claimed[2]
            return claimed[1]
        me = threading.get_ident()
        for s in list(_sums):
            if s is not self and mine(s.thread, me):
                s.forget()
        n = next(_claims)
        if self._claimed is None:
            _latest_start[me] = n
        self._claimed = (me, n)
        if total is not None:
            _local.claimed = (calls(), total, self.taken)
        return total

    def forget(self) -> None:
        """Drop the losses since the last step: another optimizer's step took them (unless
        frozen: a closure's re-evaluations of this step are under way)."""
        if not self.frozen:
            self.total, self.count, self.filled, self._dropped, self._left = None, 0, False, None, None
            self._bad, self._scaled, self._norm = None, False, None

    def note_norm(self, norm: torch.Tensor) -> None:
        """The total gradient norm ``clip_grad_norm_`` took of the passes since the last reset:
        a script that skips its step on a non-finite norm throws them away too."""
        self._norm = norm

    @property
    def pending_skips(self) -> bool:
        """Passes were thrown away since the last step (their losses' check is on the device)."""
        return self._bad is not None

    def thrown_away(self, end: bool = True) -> bool:
        """No step came for the passes thrown away so far (a script that skips its steps on
        a NaN loss, for longer than a step takes): count them in :attr:`skipped`. With
        ``end`` (the script ends) the passes since the last reset too, and start over.
        Whether any were pending."""
        pending = self._bad is not None
        if end and self.total is not None and not self._scaled and not self._superseded():
            self._bad = _nonfinite(self.total, self._norm, self._bad)
            pending = True
        self._count_skipped()
        self._bad = None
        if end:
            self.total, self.count, self.filled, self._dropped, self._left = None, 0, False, None, None
            self._scaled, self._norm = False, None
        return pending

    def _superseded(self) -> bool:
        """Another training began stepping in this one's thread after this one last stepped
        (its optimizer made later, or stepped first later): the passes since are that
        training's. A distilled student's ``backward()`` that raised (anomaly mode's
        "returned nan values") was also its finished teacher's, whose monitor reported it
        at exit as a step skipped on a NaN at the teacher's last step. Optimizers that
        take turns (a GAN's) each stepped since the other began: neither is superseded."""
        if self._claimed is None:
            return False
        me, n = self._claimed
        return _latest_start.get(me, 0) > n

    def _count_skipped(self) -> None:
        """Add this step's resets that threw away a non-finite loss to :attr:`skipped`."""
        if self._bad is not None:
            self.skipped = self._bad if self.skipped is None else self.skipped + self._bad.to(self.skipped.device)

    def close(self) -> None:
        _sums.discard(self)


def _nonfinite(total: torch.Tensor, norm: torch.Tensor | None, count: torch.Tensor | None) -> torch.Tensor:
    """``count`` plus 1 if ``total`` (a sum of losses: not finite when one of them is not)
    or the gradient ``norm`` clipping took of them is not finite, on the device: no read-back."""
    bad = torch.isfinite(total).logical_not()
    if norm is not None:
        bad = bad | torch.isfinite(norm.detach().reshape(())).logical_not().to(bad.device)
    out = bad.to(torch.float32)
    return out if count is None else count + out.to(count.device)


def unclaimed() -> None:
    """An optimizer that no monitor watches stepped: the losses since any optimizer last
    stepped were its step's. Every sum forgets them, as :meth:`LossSum.claim` makes them,
    and a step after it with no ``backward()`` of its own shares none of them: Reptile's
    meta-optimizer steps on the distance that a task's inner optimizer travelled, and the
    losses of the task (of any amplitude) are no loss of the meta-model's."""
    me = threading.get_ident()
    for s in list(_sums):
        if mine(s.thread, me):
            s.forget()
    _local.claimed = None


@profiled.labelled(profiled.BACKWARD)
def _seen(root: Any, tensors: Any = None, grads: Any = None) -> None:
    """A ``backward()`` begins: ``root.backward()``, or with ``tensors`` and ``grads`` given,
    ``torch.autograd.backward(tensors, grads)`` (``root`` its first tensor, the graph the
    listeners walk). Its loss, if it has one (:func:`_loss_of`), goes to every sum, the
    listeners and sums of trainings that step in another thread excepted."""
    global _failures
    _local.calls = getattr(_local, "calls", 0) + 1
    me = threading.get_ident()
    for listener in list(backward_listeners):
        if mine(getattr(listener, "stepped_in", None), me):
            listener.before_backward(root)
    if not _sums or _failures >= 3:
        return
    try:
        tensors = (root,) if tensors is None else tensors
        loss = _loss_of(tensors, grads)
        if loss is None:
            return
        value, scaled, hand = loss
        grad_scaler = _scaler if scaled else None
        for s in list(_sums):
            if s.thread is None:  # its first loss: its training's thread (zero-code mode's early sum)
                s.thread = me
            if s.thread == me:
                s.add(value, scaled, grad_scaler, hand)
    except Exception:  # never into training
        _failures += 1
        if _failures == 1:
            log.warning("sentinel: reading the loss at backward() failed; training continues", exc_info=True)


def _loss_of(tensors: Any, grads: Any) -> tuple[torch.Tensor, bool, float | None] | None:
    """The loss whose gradients a ``backward()`` of ``tensors`` with ``grads`` (None: ones)
    applies, on the first's device, whether a ``GradScaler`` scaled it, and the power of two
    a single loss was last multiplied by (:func:`hand_scale`, for :meth:`LossSum.add` to
    judge); or None if it is not a loss: every tensor a single element that requires grad,
    each gradient None or a single element. That is their sum, each times its gradient (the
    WGAN scripts' ``err_fake.backward(mone)``, ``mone = -1``, applies ``-err_fake``) and
    divided by the ``GradScaler`` scale when the scaler scaled it.
    A non-scalar output given its gradients (a stage's output and its downstream
    gradients, a split backward) is not a loss: its dot product with them is no figure a
    script would log, and would spoil the sum of the step's real loss."""
    if grads is not None and (not isinstance(grads, (list, tuple)) or len(grads) != len(tensors)):
        return None
    total: torch.Tensor | None = None
    scaled = False
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor) or t.numel() != 1 or not t.requires_grad:
            return None
        value = t.detach().reshape(()).float()
        g = grads[i] if grads is not None else None
        if g is not None:
            if not isinstance(g, torch.Tensor) or g.numel() != 1:
                return None
            value = value * g.detach().reshape(()).float().to(value.device)
        if _scaled is not None and _scaled() is t:
            scaled = True
            scale = getattr(_scaler, "_scale", None)
            if isinstance(scale, torch.Tensor):
                value = value / scale.reshape(()).to(value.device)  # on the device: no sync
        total = value if total is None else total + value.to(total.device)
    if total is None:
        return None
    one = len(tensors) == 1 and not scaled and (grads is None or grads[0] is None)
    return total, scaled, hand_scale(tensors[0]) if one else None


HAND_SCALE_MIN = 128.0
"""The least power of two a loss is first taken to be scaled by: loss scalers begin at 2**7
(fairseq's ``--fp16-init-scale``) to 2**16 (apex's and DeepSpeed's dynamic scales), while a
knowledge distillation's ``kl_div(...) * T * T`` is 4 to 64 for the usual temperatures 2 to 8."""


def hand_scale(t: torch.Tensor) -> float | None:
    """The constant power of two (not 1) that ``t`` was last multiplied by before
    ``backward()``, or None: a loss scaler of the script's own, once :meth:`LossSum.add`
    saw one of at least :data:`HAND_SCALE_MIN`. apex's amp (``amp.scale_loss``:
    ``loss.float() * loss_scale``), fairseq's ``DynamicLossScaler`` and DeepSpeed's fp16
    engine multiply the loss by a Python float, a power of two that doubles after a run of
    clean steps and halves at an overflow (whose step they skip), and unscale the gradients
    before the optimizer's step. The loss that reached ``backward()`` is then 65,536 times
    the script's, and each change of the scale read as the loss doubling or halving (a
    critical ``LossDivergence``). Such a factor is the last operation of the graph: autograd
    keeps it as ``MulBackward0``'s ``other``, a 0-dim CPU tensor (a Python number is one,
    whatever the loss's device), so reading it never waits for a device. A scale held in a
    device tensor (Megatron's) is not read: that would wait for the device. Nor is a saved
    factor with an unpack hook (``saved_tensors_hooks``: offloading, or a non-reentrant
    checkpoint whose unpack recomputes the forward): reading it would run the hook outside
    the backward pass. A Python number is never packed, so no hook holds one."""
    try:
        fn = t.grad_fn
        if fn is None or type(fn).__name__ != "MulBackward0":
            return None
        raw = getattr(fn, "_raw_saved_other", None)
        if raw is None or getattr(raw, "unpack_hook", True) is not None:
            return None  # an unpack hook (or a torch that cannot say): not ours to run
        other = getattr(fn, "_saved_other", None)
        if (not isinstance(other, torch.Tensor) or other.dim() != 0 or other.device.type != "cpu"
                or other.requires_grad):
            return None
        scale = float(other)
    except Exception:
        return None
    if scale > 0.0 and scale != 1.0 and math.isfinite(scale) and math.frexp(scale)[0] == 0.5:
        return scale
    return None


@profiled.labelled(profiled.BACKWARD)
def _after() -> None:
    me = threading.get_ident()
    for s in list(_sums):
        if s.thread == me:
            s.after()
    for listener in list(backward_listeners):
        after = getattr(listener, "after_backward", None)
        if after is not None and mine(getattr(listener, "stepped_in", None), me):
            after()


def _grad_loss(outputs: Any, inputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The loss of a ``torch.autograd.grad`` call that stands for ``backward()``: one scalar
    output, the gradients of leaf parameters, no graph kept for a higher order (a gradient
    penalty or a Hessian-vector product is not a loss)."""
    try:
        if kwargs.get("create_graph") or (len(args) >= 3 and args[2]) or kwargs.get("is_grads_batched"):
            return None
        out = outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs
        ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if (isinstance(out, torch.Tensor) and out.numel() == 1 and out.requires_grad and ins
                and all(isinstance(t, torch.nn.Parameter) for t in ins)):
            return out
    except Exception:
        pass
    return None


def install() -> None:
    """Wrap ``Tensor.backward``, ``torch.autograd.backward``, ``torch.autograd.grad`` and
    ``GradScaler.scale`` once per process (cheap while no :class:`LossSum` listens: one
    function call per ``backward()``)."""
    global _installed
    if _installed:
        return
    _installed = True
    original = torch.Tensor.backward
    original_backward = torch.autograd.backward
    # torch's own Tensor.backward only hands its arguments to torch.autograd.backward (after
    # __torch_function__'s dispatch): for a plain tensor the wrapper calls torch's
    # torch.autograd.backward itself, so a traceback out of backward() has one frame of Sentinel's
    direct = getattr(original, "__module__", None) == "torch._tensor"
    depth = _depth

    def nested(me: int) -> bool:
        # on CUDA a re-entrant checkpoint's nested call comes from autograd's device thread, a thread
        # Python did not start (threading's dummy for it), while the training thread is inside its pass
        return me in depth or (bool(depth) and isinstance(threading.current_thread(), _DUMMY))

    # Traced by dynamo (torch.compile), each wrapper calls itself through
    # torch.compiler.disable: dynamo breaks the graph there, as it does at torch's own
    # backward(), and runs it as it is. Traced through, its bookkeeping (a thread-local
    # count) was a guard that changed at every step: Keras's jit_compile=True train step
    # was compiled again at each call until dynamo gave up, and its losses differed in
    # their 6th digit. The test is is_dynamo_compiling(), not is_compiling(): AOTAutograd's
    # own autograd.grad, while it traces a compiled backward, is no dynamo trace, and with
    # is_compiling() the call went round in circles.
    def backward(self: torch.Tensor, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
                 inputs: Any = None) -> Any:
        if torch.compiler.is_dynamo_compiling():
            return eager_backward(self, gradient, retain_graph, create_graph, inputs)
        _seen(self, None, None if gradient is None else (gradient,))
        me = threading.get_ident()
        d = depth.get(me, 0)
        depth[me] = d + 1
        try:
            if direct and not has_torch_function_unary(self):
                out = original_backward(self, gradient, retain_graph, create_graph, inputs=inputs)
            else:
                out = original(self, gradient, retain_graph, create_graph, inputs=inputs)
        finally:
            if d:
                depth[me] = d
            else:
                del depth[me]
        _after()
        return out

    backward.__doc__ = original.__doc__
    eager_backward = torch.compiler.disable(backward)
    torch.Tensor.backward = backward  # type: ignore[method-assign]

    def autograd_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_dynamo_compiling():
            return eager_autograd_backward(tensors, *args, **kwargs)
        me = threading.get_ident()
        if nested(me):
            return original_backward(tensors, *args, **kwargs)
        if not isinstance(tensors, (torch.Tensor, list, tuple)) and hasattr(tensors, "__iter__"):
            tensors = tuple(tensors)  # a generator: read once here, handed on whole
        seq = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
        grads = args[0] if args else kwargs.get("grad_tensors", kwargs.get("grad_variables"))
        if isinstance(grads, torch.Tensor):
            grads = (grads,)
        _seen(seq[0] if isinstance(seq, (list, tuple)) and seq else None, seq, grads)
        depth[me] = 1
        try:
            out = original_backward(tensors, *args, **kwargs)
        finally:
            del depth[me]
        _after()
        return out

    autograd_backward.__doc__ = original_backward.__doc__
    eager_autograd_backward = torch.compiler.disable(autograd_backward)
    torch.autograd.backward = autograd_backward  # type: ignore[assignment]

    original_grad = torch.autograd.grad

    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_dynamo_compiling():
            return eager_grad(outputs, inputs, *args, **kwargs)
        if not isinstance(inputs, (list, tuple, dict, torch.Tensor)) and hasattr(inputs, "__iter__"):
            inputs = tuple(inputs)  # model.parameters(): read once here, handed on whole
        loss = _grad_loss(outputs, inputs, args, kwargs)
        if loss is not None:
            _seen(loss)  # a loop that takes its gradients with autograd.grad instead of backward()
        out = original_grad(outputs, inputs, *args, **kwargs)
        if loss is not None:
            _after()
        return out

    grad.__doc__ = original_grad.__doc__
    eager_grad = torch.compiler.disable(grad)
    torch.autograd.grad = grad  # type: ignore[assignment]

    scaler_cls = torch.amp.GradScaler
    original_scale = scaler_cls.scale

    def scale(self: Any, outputs: Any) -> Any:
        global _scaler, _scaled
        out = original_scale(self, outputs)
        try:
            if isinstance(out, torch.Tensor) and out.numel() == 1:
                _scaler = self
                _scaled = weakref.ref(out)
        except Exception:
            pass
        return out

    scale.__doc__ = original_scale.__doc__
    scaler_cls.scale = scale  # type: ignore[method-assign]
