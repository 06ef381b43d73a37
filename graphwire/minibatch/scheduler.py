"""ByteGNN's two-level scheduling of sampling task graphs.

ByteGNN (seed ``002`` §4.2; digest §3.2 (c), (d)) samples each mini-batch
as a DAG of small tasks run by a pool of sampling threads, and schedules at
two levels:

- **fine** (:class:`TaskPool`): a task is *ready* once its parents are done;
  the pool's threads take ready tasks by ``(DAG ID, cost, sequence)``: the
  oldest DAG first (IDs grow with launch order), then the cheapest task of
  it, then the first made. A DAG's last task is never stuck behind a later
  DAG's hops, as it would be under FIFO (``policy="fifo"``: by sequence
  alone, the baseline).
- **coarse** (:class:`LaunchPolicy`, Algorithm 1): a new DAG is launched
  once ``T_gap * f(C_util) * balance >= σ``, where ``T_gap`` is the seconds
  since the last launch, ``f(C) = 101 - exp(C / c)``, ``c = 100 / ln 101``
  (``f(0) = 100``, ``f(100) = 0``: launch eagerly while the CPUs idle,
  hold back as they fill), and ``balance = T_sample / (T_train * Q_size)``,
  the mean seconds to sample a batch over the seconds the trainer needs for
  the ``Q_size`` batches already waiting for it. ``Q_size = 0`` (the trainer
  has nothing to take) launches at once, as the digest's design note has
  it; so does a trainer not yet timed. Otherwise the launcher sleeps 5 ms
  and looks again.

:class:`DagRunner` is the launcher: it walks the batch keys in order,
launches one DAG per key when the policy says so (and fewer than ``depth``
DAGs are alive, the memory bound), and hands finished batches to the
trainer, in key order, through :meth:`DagRunner.get`. What a DAG computes
does not depend on the order its tasks ran in, so the batches are those a
serial loop makes.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from graphwire.feature.cache import from_thread

__all__ = [
    "POLICIES",
    "DagRunner",
    "LaunchPolicy",
    "Task",
    "TaskPool",
    "utilisation_factor",
]

POLICIES = ("bytegnn", "fifo")
_SCALE = 100.0 / math.log(101.0)  # c of f(C) = 101 - exp(C / c)
_IDLE_S = 0.005  # Algorithm 1's sleep between looks


def utilisation_factor(c_util: float) -> float:
    """``f(C) = 101 - exp(C / c)``, ``c = 100 / ln 101``, for ``C`` in
    percent (clamped to [0, 100]): 100 at 0%, 0 at 100%, decreasing."""
    c = min(max(c_util, 0.0), 100.0)
    return max(0.0, 101.0 - math.exp(c / _SCALE))


@dataclass
class Task:
    """One task of one DAG: ``run()`` returns the tasks it makes ready
    (its children whose other parents are done), or none.

    Attributes:
        dag: the DAG's ID (launch order).
        cost: ByteGNN's cost model: a hop's input neighbours, a fetch's rows
            times the feature dimension.
        run: the work.
        name: for errors and traces.
    """

    dag: int
    cost: float
    run: Callable[[], Iterable[Task] | None]
    name: str = "task"


class TaskPool:
    """Threads that run ready tasks by priority (module docstring).

    Args:
        threads: the pool's size (``--sampler-threads``).
        policy: ``"bytegnn"`` (DAG, cost, sequence) or ``"fifo"`` (sequence).
        on_done: ``dag -> None`` when a DAG's last task has finished.
        on_error: ``(dag, task, error) -> None`` when a task raised (its DAG
            is then abandoned: its other tasks still run, nothing new of it).
    """

    def __init__(
        self,
        threads: int,
        policy: str,
        on_done: Callable[[int], None],
        on_error: Callable[[int, Task, BaseException], None],
    ) -> None:
        if threads < 1:
            raise ValueError(f"sampler threads: expected >= 1, got {threads}")
        if policy not in POLICIES:
            raise ValueError(f"schedule: expected one of {POLICIES}, got {policy!r}")
        self.policy, self.on_done, self.on_error = policy, on_done, on_error
        self._heap: list[tuple[Any, ...]] = []
        self._seq = itertools.count()
        self._pending: dict[int, int] = {}  # dag -> tasks submitted, not done
        self._failed: set[int] = set()
        self._cond = threading.Condition()
        self._stop = False
        self.order: list[str] | None = None  # names in run order (tests)
        self._threads = [
            threading.Thread(target=self._work, name=f"sampler-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, tasks: Iterable[Task]) -> None:
        """Make ``tasks`` ready (a DAG's roots, or children)."""
        with self._cond:
            for task in tasks:
                seq = next(self._seq)
                key = (seq,) if self.policy == "fifo" else (task.dag, task.cost, seq)
                heapq.heappush(self._heap, (*key, task))
                self._pending[task.dag] = self._pending.get(task.dag, 0) + 1
            self._cond.notify_all()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                task: Task = heapq.heappop(self._heap)[-1]
                if self.order is not None:
                    self.order.append(task.name)
            children: list[Task] = []
            error: BaseException | None = None
            if task.dag not in self._failed:
                try:
                    children = list(task.run() or ())
                except BaseException as caught:  # handed to the DAG's owner
                    error = caught
            if error is not None:
                with self._cond:
                    self._failed.add(task.dag)
                self.on_error(task.dag, task, error)
            self.submit(children)
            with self._cond:
                self._pending[task.dag] -= 1
                done = self._pending[task.dag] == 0
                if done:
                    del self._pending[task.dag]
            if done and task.dag not in self._failed:
                self.on_done(task.dag)

    def close(self) -> None:
        """Stop the threads (tasks not started are dropped)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5.0)


@dataclass
class LaunchPolicy:
    """When to launch the next DAG (Algorithm 1; module docstring).

    Attributes:
        sigma: σ, the launch score's threshold (> 0).
        window: batches the mean sampling and training seconds are over.
        fifo: launch whenever the memory bound allows (the baseline).
    """

    sigma: float = 1.0
    window: int = 8
    fifo: bool = False
    _sample_s: deque[float] = field(init=False, repr=False)
    _train_s: deque[float] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma: expected a number > 0, got {self.sigma}")
        if self.window < 1:
            raise ValueError(f"window: expected >= 1, got {self.window}")
        self._sample_s = deque(maxlen=self.window)
        self._train_s = deque(maxlen=self.window)
        self._lock = threading.Lock()

    def sampled(self, seconds: float) -> None:
        """A DAG took ``seconds`` from launch to its last task (a pool
        thread reports it)."""
        with self._lock:
            self._sample_s.append(seconds)

    def trained(self, seconds: float) -> None:
        """The trainer took ``seconds`` over one batch."""
        with self._lock:
            self._train_s.append(seconds)

    def score(self, gap_s: float, c_util: float, q_size: int) -> float:
        """``T_gap f(C_util) balance``: infinite while the trainer has
        nothing waiting (``Q_size = 0``) or has not been timed."""
        with self._lock:  # the pool and the trainer append meanwhile
            if q_size <= 0 or not self._train_s or not self._sample_s:
                return math.inf
            t_sample = sum(self._sample_s) / len(self._sample_s)
            t_train = sum(self._train_s) / len(self._train_s)
        if t_train <= 0:
            return math.inf
        balance = t_sample / (t_train * q_size)
        return gap_s * utilisation_factor(c_util) * balance

    def launch(self, gap_s: float, c_util: float, q_size: int) -> bool:
        return self.fifo or self.score(gap_s, c_util, q_size) >= self.sigma


class DagRunner:
    """Launches one DAG per batch key and hands the batches out in order.

    Args:
        keys: the batch keys, in the order the trainer takes them.
        make: ``(key, dag, finish) -> roots``: the DAG of ``key``'s batch
            (runs on the launcher's thread); its last task calls
            ``finish(item)`` with the batch.
        threads: the sampling pool's threads.
        schedule: the pool's task order, ``"bytegnn"`` or ``"fifo"``.
        policy: the coarse launch rule.
        depth: the most DAGs alive, launched and not yet released (memory).
        cpu: ``() -> C_util`` percent (default: psutil's system-wide).
    """

    def __init__(
        self,
        keys: Iterable[Hashable],
        make: Callable[[Hashable, int, Callable[[object], None]], Iterable[Task]],
        threads: int,
        schedule: str,
        policy: LaunchPolicy,
        depth: int,
        cpu: Callable[[], float] | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth: expected >= 1, got {depth}")
        self.make, self.policy, self.depth = make, policy, depth
        self.cpu = cpu if cpu is not None else _system_cpu()
        self._keys = list(keys)
        self._cond = threading.Condition()
        self._items: dict[Hashable, object] = {}  # finished, not yet taken
        self._launched: dict[int, tuple[Hashable, float]] = {}  # dag: key, start
        self._finished: set[int] = set()  # DAGs whose batch is made
        self._alive = 0
        self._error: BaseException | None = None
        self._stop = False
        self.counters: dict[str, float] = {
            "launched": 0,
            "peak_inflight": 0,
            "peak_queue": 0,
            "launch_waits": 0,
        }
        self._window = _Window()  # since the last :meth:`window`
        self.pool = TaskPool(threads, schedule, self._done, self._failed)
        self._thread = threading.Thread(
            target=self._launch, name="launcher", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ launcher
    def _launch(self) -> None:
        last = time.perf_counter()
        for dag, key in enumerate(self._keys):
            while True:
                with self._cond:
                    if self._stop or self._error is not None:
                        return
                    q_size = len(self._items)
                    room = self._alive < self.depth
                now = time.perf_counter()
                c_util = self.cpu()
                with self._cond:
                    self._window.cpu(c_util)
                if room and self.policy.launch(now - last, c_util, q_size):
                    break
                self.counters["launch_waits"] += 1
                time.sleep(_IDLE_S)
            last = time.perf_counter()
            with self._cond:
                self._launched[dag] = (key, last)
                self._alive += 1
                self.counters["launched"] += 1
                self._note()
            try:
                roots = list(self.make(key, dag, self._finisher(key, dag)))
            except BaseException as error:
                self._fail(from_thread(f"sampling DAG {dag}", error))
                return
            self.pool.submit(roots)

    def _finisher(self, key: Hashable, dag: int) -> Callable[[object], None]:
        def finish(item: object) -> None:
            with self._cond:
                self._items[key] = item
                self._finished.add(dag)
                self._note()
                self._cond.notify_all()

        return finish

    def _note(self) -> None:
        inflight = len(self._launched)
        queue = len(self._items)
        self.counters["peak_inflight"] = max(self.counters["peak_inflight"], inflight)
        self.counters["peak_queue"] = max(self.counters["peak_queue"], queue)
        self._window.note(queue, inflight)

    def _done(self, dag: int) -> None:
        with self._cond:
            _, started = self._launched.pop(dag)
            if dag not in self._finished:  # (the trainer may have its batch)
                self._fail_locked(
                    RuntimeError(f"sampling DAG {dag} ended without a batch")
                )
                return
            self._finished.discard(dag)
            self._note()
        self.policy.sampled(time.perf_counter() - started)

    def _failed(self, dag: int, task: Task, error: BaseException) -> None:
        self._fail(from_thread(f"sampling DAG {dag}, task {task.name}", error))

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            self._fail_locked(error)

    def _fail_locked(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._cond.notify_all()

    # ------------------------------------------------------------- trainer
    def get(self, key: Hashable) -> object:
        """``key``'s batch, waited for; a sampling task's error raised here."""
        with self._cond:
            while key not in self._items:
                if self._error is not None:
                    raise self._error
                self._cond.wait(timeout=0.05)
            return self._items.pop(key)

    def release(self, train_s: float) -> None:
        """The trainer is done with a batch it took ``train_s`` over: its
        DAG's memory is free."""
        self.policy.trained(train_s)
        with self._cond:
            self._alive -= 1
            self._note()

    def window(self) -> dict[str, float]:
        """Since the last call: DAGs launched, the mean and largest queue of
        finished batches and of DAGs in flight (at each change), and the
        mean CPU utilisation the launcher saw."""
        with self._cond:
            window, self._window = self._window, _Window()
        return window.record()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        self.pool.close()


@dataclass
class _Window:
    """Queue, DAGs in flight and CPU utilisation between two records."""

    changes: int = 0
    queue_sum: int = 0
    queue_max: int = 0
    inflight_sum: int = 0
    inflight_max: int = 0
    cpu_sum: float = 0.0
    cpu_looks: int = 0

    def note(self, queue: int, inflight: int) -> None:
        self.changes += 1
        self.queue_sum += queue
        self.queue_max = max(self.queue_max, queue)
        self.inflight_sum += inflight
        self.inflight_max = max(self.inflight_max, inflight)

    def cpu(self, c_util: float) -> None:
        self.cpu_sum += c_util
        self.cpu_looks += 1

    def record(self) -> dict[str, float]:
        changes = max(self.changes, 1)
        return {
            "queue_mean": self.queue_sum / changes,
            "queue_max": self.queue_max,
            "inflight_mean": self.inflight_sum / changes,
            "inflight_max": self.inflight_max,
            "cpu_util": self.cpu_sum / self.cpu_looks if self.cpu_looks else 0.0,
        }


def _system_cpu() -> Callable[[], float]:
    """psutil's CPU utilisation since the last call, in percent."""
    psutil.cpu_percent(interval=None)  # the first call's baseline
    return lambda: float(psutil.cpu_percent(interval=None))
