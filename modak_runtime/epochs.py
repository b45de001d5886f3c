"""An epoch's length, counted from the passes a script's loop makes over its training data.

A framework's support has :meth:`Epochs.watch` hook the start of each pass over a data
source (PyTorch's ``DataLoader.__iter__``, a ``tf.data.Dataset``'s) and the fetching of its
batches (:meth:`Epochs.pass_began`, :meth:`Epochs.batch`); at each optimizer step of the
trained model, :meth:`Epochs.at_step` takes the source whose batch came last as the one it
trains over (not a validation source, whose pass ended before the step's batch came).  The steps between two passes over that source are an epoch's
(``Session.steps_per_epoch``, said in ``effect["steps_per_epoch"]``); where no whole pass
was seen (a trial stopped within the first epoch), :meth:`Epochs.finish` takes the source's
stated number of batches over the micro-batches a step trains on.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

from .session import Session

PASSES_KEPT = 16  # the latest passes over data sources kept, for the epoch's length


class Epochs:
    def __init__(self, session: Session, source: str,
                 batches: Callable[[Any], Optional[int]]):
        """``source``: what the script's training data is called in ``effect`` ("data
        loader"); ``batches``: a source's stated number of batches (None: not stated)."""
        self.s, self.source, self.batches = session, source, batches
        # the passes begun lately (their iterators' ids -> the source, weakly held as the
        # script holds it, and the steps made when the pass began), the pass whose batch
        # came last, and the source the trained model's steps ran over, when its pass
        # began and its batches
        self.passes: dict[int, tuple[weakref.ref, int]] = {}
        self.batch_from: Optional[int] = None
        self.train_source: Optional[weakref.ref] = None
        self.train_from = 0
        self.train_batches: Optional[int] = None

    def watch(self, source_class: type, iterator_class: Optional[type]) -> None:
        """Hook the start of each pass over a ``source_class`` (its ``__iter__``) and each
        batch its iterators (of ``iterator_class``) fetch.  Without the iterator class (a
        private one, which another version of the framework may not have) the epoch is
        left unmeasured, never the script broken."""
        if iterator_class is None:
            return
        me = self
        original_iter, original_next = source_class.__iter__, iterator_class.__next__

        def pass_over(source):
            iterator = original_iter(source)
            me.pass_began(source, iterator)
            return iterator

        def next_batch(iterator):
            me.batch(iterator)
            return original_next(iterator)

        pass_over.__wrapped__, next_batch.__wrapped__ = original_iter, original_next
        source_class.__iter__, iterator_class.__next__ = pass_over, next_batch

    def pass_began(self, source: Any, iterator: Any) -> None:
        """A pass over ``source`` begins.  Where it is the training source's next pass,
        the steps since its last one began are an epoch's, counted (a script that breaks
        off its epochs early is counted as it runs them)."""
        steps = len(self.s.step_ends)
        train = self.train_source() if self.train_source is not None else None
        if train is source:
            if steps > self.train_from:
                self.s.steps_per_epoch = steps - self.train_from
                self.s.effect["steps_per_epoch"] = (
                    f"counted: the optimizer steps of a whole pass over the training "
                    f"{self.source}")
            self.train_from = steps
        try:
            self.passes[id(iterator)] = (weakref.ref(source), steps)
        except TypeError:  # (a source that takes no weak reference: no epoch for it)
            return
        while len(self.passes) > PASSES_KEPT:  # (the oldest first: dicts keep their order)
            del self.passes[next(iter(self.passes))]

    def batch(self, iterator: Any) -> None:
        """A batch came from ``iterator``'s pass."""
        self.batch_from = id(iterator)

    def at_step(self) -> None:
        """At a step of the trained model: the source whose batch came last is the one it
        trains over."""
        entry = self.passes.get(self.batch_from) if self.batch_from is not None else None
        if entry is None or (self.train_source is not None
                             and entry[0]() is self.train_source()):
            return
        self.train_source, self.train_from = entry
        source = entry[0]()
        try:
            self.train_batches = self.batches(source) if source is not None else None
        except (TypeError, ValueError):  # (a source of no stated length)
            self.train_batches = None

    def finish(self, micro: int = 1) -> None:
        """No whole pass over the training source was seen: an epoch is its batches over the
        micro-batches one step trains on."""
        s = self.s
        if s.steps_per_epoch is not None or not self.train_batches:
            return
        s.steps_per_epoch = max(1, self.train_batches // micro)
        s.effect["steps_per_epoch"] = (
            f"the training {self.source}'s {self.train_batches} batches over {micro} "
            f"micro-batch{'es' if micro > 1 else ''} a step")
