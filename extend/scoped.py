"""Changes a patch makes outside its model, each recorded with how to put it back.

A patch changes its own model in place (the rotary module, attention scalings, hooks). A few things need state
every model in the process shares: xpos wraps a family module's `apply_rotary_pos_emb` (extend/xpos.py), the
position-remapping methods register an attention function with transformers' registries
(extend/remap_attention.py), and the prefix cache sets transformers' switch for grouped heads in SDPA around
each continued forward (extend/prefix_cache.py: transformers reads it from the environment; it has no per-call
flag). Each is a `Change` recorded on the patch it serves (`Patch.global_changes`, listed by `extend.inspect`)
and restored by `Patch.undo()`, also when undo runs because of an exception. Shared changes are
reference-counted (`Shared`): the first user installs one, the last one's restore removes it, so one model's
undo never pulls a change from under another model of the process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Hashable


class Change:
    """One recorded change. `name`: what changed (e.g. "transformers.models.llama.modeling_llama.
    apply_rotary_pos_emb"); `description`: what it does instead, and who else sees it; `shared`: True for a
    process-wide change (every model sees it), False for one to this model only. `restore()` puts it back,
    once (later calls do nothing)."""

    def __init__(self, name: str, description: str, restore: Callable[[], None], *, shared: bool = True):
        self.name, self.description, self.shared = name, description, shared
        self._restore: Callable[[], None] | None = restore

    @property
    def active(self) -> bool:
        """Not restored yet."""
        return self._restore is not None

    def restore(self) -> None:
        restore, self._restore = self._restore, None
        if restore is not None:
            restore()

    def __repr__(self) -> str:
        state = "" if self.active else ", restored"
        return f"Change({self.name!r}: {self.description}{state})"


class Shared:
    """Process-wide changes several patches may hold at once, by key: `acquire(key, install)` runs `install()`
    (which makes the change and returns its restore function) for the first holder only; the returned release
    function, called once per acquire, restores the change when the last holder releases it."""

    def __init__(self):
        self._held: dict[Hashable, list] = {}  # key -> [restore, number of holders]
        self._lock = threading.Lock()

    def holds(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._held

    def acquire(self, key: Hashable, install: Callable[[], Callable[[], None]]) -> Callable[[], None]:
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                entry = self._held[key] = [install(), 0]
            entry[1] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                entry[1] -= 1
                if entry[1] or self._held.get(key) is not entry:
                    return
                del self._held[key]
            entry[0]()

        return release


_ENVIRONMENT = Shared()


@contextlib.contextmanager
def environment(name: str, value: str, description: str, owner=None):
    """Context: os.environ[name] = value inside, restored on exit (also on error); nested or concurrent uses
    share one setting, removed by the last to leave. A value the user set before stands (nothing changes).
    While active, the change is recorded on `owner` (a Patch, or None) so its undo restores it too and
    `owner.global_changes` names it."""
    if name in os.environ and not _ENVIRONMENT.holds(name):
        yield  # the user's own setting stands
        return

    def install():
        os.environ[name] = value
        return lambda: os.environ.pop(name, None)

    change = Change(f"environment variable {name}={value}", description, _ENVIRONMENT.acquire(name, install))
    if owner is not None:
        owner.record(change)
    try:
        yield
    finally:
        change.restore()
