"""Optimizers in a game: a GAN's generator and discriminator, an actor and its critic.

In a game, each player's loss is measured against the other player, who moves: a GAN's
generator loss is the discriminator's verdict on its samples, and it rises as the
discriminator learns, while the discriminator's rises as the generator gets better. Neither
is a progress measure, and the loss rules' rules of thumb (a loss that rose since the start,
that stays above its best level, that swings) fire on healthy games: a 2-D GAN that
converged to its data paged ``EarlyLossRising`` (critical) at step 87 with the
non-saturating, least-squares and softplus losses alike, and with the hinge loss
``LossDivergence`` (critical) and ``LossOscillation`` too (tests/programs/sngan.py).

What marks a game is where a player's loss reaches. The generator's loss runs through the
discriminator, so either its ``backward()`` also changes the discriminator's gradients (which
the discriminator's next ``zero_grad()`` throws away: the PyTorch examples' DCGAN), or the
script turns the discriminator's ``requires_grad`` off for the generator's step and on again
for its own (the original WGAN's ``main.py``, pix2pix and CycleGAN's ``set_requires_grad``,
StyleGAN2 ports). So two optimizers are players of one game when one of them steps on a
loss of its own (a ``backward()`` since any optimizer last stepped) that changed a gradient
of the other's parameters, or while the other's were frozen, and does so again after the
other stepped on a loss of its own. A fine-tuning script's stages are no game: a head
trained while the backbone is frozen, then the backbone by its own optimizer (whose loss
reaches the head's gradients too) never go back to the first stage.

Optimizers stepped one after another after one ``backward()`` (an encoder's and a
decoder's, a sparse table's ``SparseAdam`` and a dense head's ``Adam``) share a loss, and
are no game. Nor are optimizers over shared parameters, each stepped on a loss of its own
(a multi-task script's, each over the trunk and its task's head): both lower their own loss
on the trunk, where a game's players each own theirs. A bilevel search that alternates two
optimizers over one graph (DARTS) reads as one; ``WatchOptions.game`` says otherwise.

A player's first round of steps goes out as a loss, before the second round shows the game:
the engine drops a stream's loss series when its objective arrives.

Each :class:`Player` reads one parameter around every ``backward()``: its ``requires_grad``
and its gradient (set or not, its identity, its version counter: autograd accumulates in
place). Attribute reads, no sync.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

import torch

from sentinel.instrument import losses

# per thread (threads that each train a model of their own play no game together): the players
# whose gradient a backward() changed, or that were frozen at one, since an optimizer last
# stepped (.reached), and losses.calls() then (.calls)
_local = threading.local()


def _reached() -> weakref.WeakSet[Player]:
    reached = getattr(_local, "reached", None)
    if reached is None:
        reached = _local.reached = weakref.WeakSet()
    return reached


class Player:
    """One monitor's optimizers, as seen by the others (see the module docstring)."""

    def __init__(self, param: torch.Tensor | None, params: Iterable[torch.Tensor] = ()) -> None:
        self._param = weakref.ref(param) if param is not None else None
        self._id = id(param)
        self._ids = frozenset(id(p) for p in params)  # all its optimizers' parameters
        self._grad: tuple[int, int] | None = None  # (id, version) of the gradient before a backward()
        self.own = 0  # its steps on a loss of its own (a backward() since any optimizer stepped)
        # the players its own losses reached (or found frozen), with their own steps' count then
        self.reached: weakref.WeakKeyDictionary[Player, int] = weakref.WeakKeyDictionary()
        self.adversarial = False  # found in a game: for good

    def _state(self) -> tuple[int, int] | None:
        try:
            p = self._param() if self._param is not None else None
            g = p.grad if p is not None else None
            return None if g is None else (id(g), g._version)
        except Exception:  # a tensor subclass without a version counter: no word from it
            return None

    def before(self) -> None:
        """A ``backward()`` begins."""
        self._grad = self._state()
        p = self._param() if self._param is not None else None
        if p is not None and not p.requires_grad:
            _reached().add(self)

    def after(self) -> None:
        """It returned: did it change this player's gradient?"""
        now = self._state()
        if now is not None and now != self._grad:
            _reached().add(self)

    def stepped(self) -> bool:
        """Its optimizers stepped: whether it is in a game (known from now on, for good)."""
        reached = _reached()
        if losses.calls() > getattr(_local, "calls", 0):  # its own loss (else: the last one's, shared)
            self.own += 1
            for other in list(reached):
                # players over shared parameters (a multi-task script's optimizers, each over
                # the trunk and its head, stepped in turn) each lower their own loss on them
                if other is not self and other._id not in self._ids and self._id not in other._ids:
                    before = self.reached.get(other)
                    if before is not None and other.own > before:  # again, after the other's own step
                        self.adversarial = other.adversarial = True
                    self.reached[other] = other.own
        reached.clear()
        _local.calls = losses.calls()
        return self.adversarial

    def leave(self) -> None:
        """Its monitor closed: a later training of the process (the next fold) plays without it."""
        _reached().discard(self)
        self._param = None
