"""A process's scratch folder, and those of processes that were killed.

:func:`~graphwire.comm.launch.launch_local` gives its workers a scratch
folder (``graphwire-run-*`` in the system's temporary folder, their
``TMPDIR``: rapid's presampled batches go there) and removes it when they
have ended. A launcher killed outright (SIGKILL, the OOM killer) runs no
clean-up, so the folder stays; the next launcher removes it. Each launcher
holds an exclusive ``flock`` on ``.lock`` in its folder for as long as it
runs (the kernel lets go when the process dies, whatever killed it), so a
folder whose lock can be taken is a dead launcher's. A lock, unlike a PID,
tells the same across PID namespaces sharing the folder (the locks are
:mod:`graphwire.fsutil`'s, as for its temporary folders). A worker under
``torchrun``, which has no launcher's folder, keeps rapid's presampled
batches in one of its own the same way (``graphwire-presample-*``).
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from graphwire import fsutil

__all__ = ["PREFIX", "Scratch", "remove_abandoned"]

PREFIX = "graphwire-run-"  # a launcher's


@dataclass
class Scratch:
    """This process's scratch folder, locked while it exists.

    Use :meth:`create`, then :meth:`remove` when every worker has ended.
    """

    path: Path
    _lock: IO[str] | None  # None: the file system has no locks

    @classmethod
    def create(cls, prefix: str = PREFIX) -> Scratch:
        """A fresh locked folder ``<prefix>*`` in the temporary folder.

        Also removes those of the same prefix whose process is dead."""
        path = Path(tempfile.mkdtemp(prefix=prefix))
        lock = fsutil.lock_folder(path)
        remove_abandoned(path.parent, prefix, keep=path)
        return cls(path, lock)

    def remove(self) -> None:
        """Remove the folder and what the workers left in it; idempotent."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()


def remove_abandoned(
    where: str | os.PathLike[str], prefix: str = PREFIX, keep: Path | None = None
) -> None:
    """Remove the ``<prefix>*`` folders in ``where`` whose process is gone.

    Gone means their ``.lock`` is not held. A folder without one (being made this
    moment, or by an older graphwire) is left alone."""
    fsutil.remove_abandoned(where, glob.escape(prefix) + "*", keep=keep)
