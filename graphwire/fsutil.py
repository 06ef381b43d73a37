"""Atomic file output and checksums, shared by every writer in graphwire.

Nothing graphwire writes is ever seen half-written: a file goes to a temporary
name beside its target and is renamed into place; a folder is filled under a
temporary name and renamed as a whole.

A writer killed outright (SIGKILL, the OOM killer) runs no clean-up, so its
temporary ``.NAME.*.tmp`` stays beside the target: the next write of the same
target removes it. The writer holds an exclusive ``flock`` on it for as long
as it runs (on the folder's ``.lock``, or on the file itself); the kernel lets
go when the process dies, whatever killed it, so one whose lock can be taken
is a dead writer's. A lock, unlike a PID, tells the same across PID
namespaces and machines sharing the folder.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np

__all__ = [
    "atomic_dir",
    "atomic_file",
    "check_creatable",
    "check_replaceable",
    "load_npy",
    "lock_folder",
    "remove_abandoned",
    "save_npy",
    "sha256_file",
    "write_failed",
    "write_json",
]

_LOCK = ".lock"


@contextmanager
def atomic_dir(
    target: str | os.PathLike[str], overwrite: bool = False
) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``target`` when the block succeeds.

    On any exception the temporary folder is removed and ``target`` is untouched.
    With ``overwrite`` an existing ``target`` is replaced if
    :func:`check_replaceable` allows it; without it, it is an error.
    """
    check_replaceable(target, overwrite)
    target = Path(os.path.abspath(target))  # "." has no name to put beside it
    made = _make_parents(target)
    tmp, lock = None, None
    try:
        tmp, lock = _locked_tmp_dir(target)
        os.chmod(tmp, 0o777 & ~_umask())  # as mkdir makes it, not mkdtemp's 0700
        yield tmp
        # Unnamed before the rename, held until after it: never seen unlocked.
        (tmp / _LOCK).unlink(missing_ok=True)
        if target.exists():
            _replace_dir(tmp, target)
        else:
            os.replace(tmp, target)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_made(target.parent, made)
        raise
    finally:
        if lock is not None:
            lock.close()


def _make_parents(target: Path) -> Path | None:
    """Make the folders above ``target`` that are missing; the topmost of
    them (None: there were none), which a failed write removes again."""
    _, top = _nearest_existing(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    return top


def _nearest_existing(path: Path) -> tuple[Path, Path | None]:
    """The nearest of ``path`` and the folders above it that exists, and the
    topmost of those below it that do not (None: ``path`` exists)."""
    above, top = path, None
    while not above.exists() and above != above.parent:
        top, above = above, above.parent
    return above, top


def _remove_made(folder: Path, top: Path | None) -> None:
    """Remove ``folder`` and those above it up to ``top`` while empty."""
    if top is None:
        return
    while True:
        try:
            folder.rmdir()
        except OSError:  # not empty: someone else's meanwhile
            return
        if folder == top:
            return
        folder = folder.parent


def _locked_tmp_dir(target: Path) -> tuple[Path, IO[str] | None]:
    """A new ``.NAME.*.tmp`` folder beside ``target``, locked; first removes
    those a killed writer of ``target`` left."""
    remove_abandoned(target.parent, f".{glob.escape(target.name)}.*.tmp")
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    )
    try:  # a SIGTERM here (KeyboardInterrupt) must not leave it
        return tmp, lock_folder(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(new: Path, target: Path) -> None:
    """Put folder ``new`` in the place of folder ``target``, whose contents
    go to a locked temporary folder first (a writer killed while removing
    them leaves it to the next)."""
    trash, lock = _locked_tmp_dir(target)
    try:
        try:
            os.replace(target, trash / "old")
        except OSError as error:
            shutil.rmtree(trash, ignore_errors=True)
            raise OSError(
                error.errno,
                f"{target}: cannot be moved aside to be replaced ({error.strerror}; "
                "a mount point? write into a folder inside it)",
            ) from None
        try:
            os.replace(new, target)
        except BaseException:
            os.replace(trash / "old", target)
            raise
        shutil.rmtree(trash, ignore_errors=True)
    finally:
        if lock is not None:
            lock.close()


def lock_folder(folder: Path) -> IO[str] | None:
    """Hold an exclusive lock on ``folder/.lock`` until the returned file is closed.

    The lock also ends when the process dies; :func:`remove_abandoned` leaves
    the folder alone meanwhile. ``folder`` must be new. None where the file
    system has no locks; then ``folder`` has no ``.lock`` and is never
    removed."""
    lock = open(folder / f"{_LOCK}.new", "w")  # noqa: SIM115 - the caller's
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: never waits
    except OSError:
        lock.close()
        os.unlink(folder / f"{_LOCK}.new")
        return None
    # Locked under another name, then named: no one sees .lock unlocked.
    os.replace(folder / f"{_LOCK}.new", folder / _LOCK)
    return lock


def remove_abandoned(
    where: str | os.PathLike[str],
    pattern: str,
    keep: Path | None = None,
    *,
    files: bool = False,
) -> None:
    """Remove the folders that match ``pattern`` in ``where`` and whose writer is gone.

    Gone: their ``.lock`` is not held; with ``files``, the files instead, those
    not locked themselves. A folder without ``.lock`` (being made this moment,
    or on a file system without locks) is left alone, as is whatever cannot be
    locked."""
    for path in Path(where).glob(pattern):
        if path == keep or path.is_symlink() or path.is_dir() == files:
            continue
        if not files and not (path / _LOCK).is_file():
            continue
        try:
            with open(path if files else path / _LOCK, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if files:
                    path.unlink(missing_ok=True)
                else:
                    shutil.rmtree(path, ignore_errors=True)
        except OSError:  # held: its writer runs; or it went meanwhile
            continue


def check_replaceable(
    target: str | os.PathLike[str], overwrite: bool, *, flag: str = "overwrite"
) -> None:
    """Refuse to replace ``target`` unless asked to and it is graphwire's own.

    A missing ``target`` is fine. An existing one may be replaced only with
    ``overwrite``, and only when it is an empty folder or a folder whose
    ``meta.json`` names a graphwire format (``"format": "graphwire.*"``) and
    that holds nothing else than what its ``meta.json`` lists (the arrays
    of a graph, the parts of a partitioned one): a regular file, someone
    else's folder, or what was put into graphwire's since (notes, another
    graph's parts) is never deleted. ``flag`` is how
    the caller's user asks to overwrite (``--overwrite`` on the command line),
    named in the errors.

    Raises:
        FileExistsError: ``target`` exists and ``overwrite`` is false.
        ValueError: ``target`` exists but is not graphwire output.
    """
    target = Path(target)
    if not (target.exists() or target.is_symlink()):
        check_creatable(target, str(target))
        return
    if not overwrite:
        raise FileExistsError(f"{target}: already exists (pass {flag} to replace it)")
    if target.is_symlink():
        found = "a symbolic link"
    elif not target.is_dir():
        found = "not a folder"
    elif next(target.iterdir(), None) is None:
        return
    elif (written := _graphwire_entries(target)) is None:
        found = "a folder without a graphwire meta.json"
    elif others := sorted(p.name for p in target.iterdir() if p.name not in written):
        shown = ", ".join(others[:3]) + (
            f" and {len(others) - 3} more" if others[3:] else ""
        )
        found = f"holds {shown}, which graphwire did not write there"
    else:
        return
    raise ValueError(
        f"{target}: {found}, refusing to replace it ({flag} replaces only "
        "folders graphwire wrote)"
    )


def check_creatable(
    target: str | os.PathLike[str], name: str, *, file: bool = False
) -> None:
    """Refuse a ``target`` that cannot be written: a folder, or with ``file`` a file.

    ``target`` must be a folder, or a path where one can be made; with
    ``file``, a file (written beside, then renamed: :func:`atomic_file`), not
    a folder, whose folder can be made.

    Args:
        target: the folder (the file) to write.
        name: how errors name it (``--out runs/x`` on the command line).
        file: ``target`` is a file.

    Raises:
        ValueError: ``target`` (or a folder above it) is a file, or with
            ``file`` a folder, or the folder that would hold it cannot be
            written.
    """
    path = Path(target)
    if file and path.is_dir():
        raise ValueError(f"{name}: is a folder, not a file")
    above, _ = _nearest_existing(path.parent if file else path)
    if not above.is_dir():
        where = "is" if above == path else f"is under {above}, which is"
        raise ValueError(f"{name}: {where} a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: {above} cannot be written")
    # Permission bits do not say it all (root may write anywhere they allow;
    # /proc or a read-only mount refuse anyway): make a folder there, at once
    # removed, rather than find out after the work.
    try:
        probe = tempfile.mkdtemp(prefix=".graphwire-probe-", dir=above)
    except OSError as error:
        why = error.strerror or type(error).__name__
        raise ValueError(f"{name}: no folder can be made in {above} ({why})") from None
    os.rmdir(probe)


def _graphwire_entries(folder: Path) -> set[str] | None:
    """The names graphwire wrote in ``folder``, as its ``meta.json`` lists
    them: ``NAME.npy`` for each of its ``arrays``, ``part_I`` for each of its
    ``parts``. None if ``folder`` has no graphwire ``meta.json``."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not (
        isinstance(meta, dict) and str(meta.get("format")).startswith("graphwire.")
    ):
        return None
    arrays, parts = meta.get("arrays"), meta.get("parts")
    return (
        {"meta.json"}
        | {f"{name}.npy" for name in (arrays if isinstance(arrays, dict) else ())}
        | {f"part_{i}" for i in range(len(parts) if isinstance(parts, list) else 0)}
    )


@contextmanager
def atomic_file(target: str | os.PathLike[str], mode: str = "w") -> Iterator[Any]:
    """Open a temporary file beside ``target``; rename it into place on success."""
    target = Path(target)
    made = _make_parents(target)
    remove_abandoned(target.parent, f".{glob.escape(target.name)}.*.tmp", files=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".new", dir=target.parent
    )
    try:
        os.chmod(tmp_name, 0o666 & ~_umask())  # as open makes it, not mkstemp's 0600
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: never waits
        except OSError:
            pass  # no locks here: stays .new, which no one removes
        else:  # locked under .new, then named: no one sees .tmp unlocked
            os.replace(tmp_name, tmp_name[: -len(".new")] + ".tmp")
            tmp_name = tmp_name[: -len(".new")] + ".tmp"
        with open(tmp_name, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        _remove_made(target.parent, made)
        raise
    finally:
        os.close(fd)


def _umask() -> int:
    """This process's umask, read without changing it where Linux tells it
    (``os.umask`` sets it too, for every thread, until it is put back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def sha256_file(path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def save_npy(folder: Path, name: str, array: np.ndarray) -> str:
    """Write ``folder/name.npy`` and return its SHA-256 (for ``meta.json``)."""
    path = folder / f"{name}.npy"
    try:
        np.save(path, np.ascontiguousarray(array), allow_pickle=False)
    except OSError as error:  # numpy's short write names neither file nor cause
        raise write_failed(path, error) from None
    return sha256_file(path)


# numpy parses .npy headers with ast.literal_eval, which CPython 3.11 cannot run
# in two threads at once ("SystemError: AST constructor recursion depth
# mismatch", CPython gh-106905): ranks that are threads of one process (the
# in-process transport) load their parts and presampled epochs at once.
_NPY_LOCK = threading.Lock()


def load_npy(
    path: str | os.PathLike[str], mmap_mode: Literal["r", "c"] | None = None
) -> Any:
    """``np.load(path, mmap_mode, allow_pickle=False)``, one thread at a time.

    The header's parse is not thread-safe on CPython 3.11; an ``.npz`` gives
    its archive, as ``np.load`` does."""
    with _NPY_LOCK:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)


def write_failed(path: str | os.PathLike[str], error: OSError) -> OSError:
    """``error``, raised writing ``path``, as one that names the file.

    A write or flush that fails (a full disk, a file size limit) says only
    ``[Errno 28] No space left on device``, and numpy's short write only
    ``N requested and M written``.

    Use as ``raise write_failed(path, error) from None``.
    """
    said = f"{path}: could not be written ({error.strerror or error})"
    if error.errno is None:
        return OSError(f"{said}; is the disk full, or a file size limit set?")
    return OSError(error.errno, said)


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write JSON atomically, pretty-printed with sorted keys.

    Raises:
        ValueError: ``payload`` holds NaN or an infinity, which JSON has not
            (Python would write ``NaN``, which strict readers refuse); nothing
            is written.
    """
    with atomic_file(path) as handle:
        json.dump(payload, handle, indent=2, sort_keys=True, allow_nan=False)
        handle.write("\n")
