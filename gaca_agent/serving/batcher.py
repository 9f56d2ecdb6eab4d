"""Concurrent chat requests batched through one rollout engine.

HTTP threads :meth:`Batcher.submit` jobs (a job is one request's ``n`` engine requests)
into a bounded queue; a full queue is refused at once (:class:`APIError` 429), never
left to wait without a bound. One thread takes every queued job (up to ``max_rows``
sampled rows), groups them by model (base or adapter) and runs each group as one engine
call, so requests that arrive while a batch runs share the next one. Each job gets its
tokens as they are sampled (for streaming) and then its completions, on its own queue.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from gaca_agent.generate.engines import Request
from gaca_agent.serving.protocol import APIError


@dataclass
class Job:
    model: str
    requests: list[Request]
    stream: bool = False
    events: queue.Queue = field(default_factory=queue.Queue)
    """``("token", choice, token_id, logprob, top)`` while sampling (streamed jobs), then
    ``("done", completions, version)`` (the weight label in force while the batch ran) or
    ``("error", exception)``."""
    cancelled: bool = False


class Batcher:
    def __init__(self, engine, adapters, max_queue: int = 64, max_rows: int = 64,
                 running: threading.Event | None = None,
                 label: Callable[[], str] = lambda: "default") -> None:
        self.engine, self.adapters = engine, adapters
        self.label = label
        """The served weights' version label; read while the batch holds the weights, so
        an answer carries the version that generated it, not the one it arrived under."""
        self.running = running or threading.Event()
        """No batch starts while it is clear (generation paused)."""
        if running is None:
            self.running.set()
        self.finished = 0  # jobs answered (done, failed, aborted or cancelled)
        self._count = threading.Lock()  # submitted and finished change on several threads
        self.max_queue, self.max_rows = max_queue, max_rows
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.batches = 0  # engine calls made
        self.submitted = 0  # jobs accepted
        self._carry: Job | None = None
        self._thread = threading.Thread(target=self._run, name="gaca-serve-batcher",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        if not self._thread.is_alive():
            raise APIError(503, "the generation thread has stopped; restart gaca-serve")
        with self._count:
            self.submitted += 1  # counted before it can be taken (see idle)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            with self._count:
                self.submitted -= 1
            raise APIError(429, f"server busy: {self.max_queue} requests are waiting; "
                                "retry later", None, "queue_full") from None

    def close(self) -> None:
        try:
            self.queue.put(None, timeout=1.0)
        except queue.Full:
            pass

    # ------------------------------------------------------------- the thread
    def idle(self) -> bool:
        """Every accepted job has been answered (nothing queued, no batch running)."""
        return self.finished >= self.submitted

    def abort_queued(self, error: Exception) -> int:
        """Answer every queued job with ``error``; how many."""
        n = 0
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self.queue.put(None)
                break
            job.events.put(("error", error))
            n += 1
        with self._count:
            self.finished += n
        return n

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            self.running.wait()  # paused: the jobs wait here, none starts
            groups: dict[str, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.model, []).append(job)
            for model, group in groups.items():
                self._generate(model, group)
                self.batches += 1
                with self._count:
                    self.finished += len(group)

    def _take(self) -> list[Job] | None:
        first = self._carry or self.queue.get()
        self._carry = None
        if first is None:
            return None
        jobs, rows = [first], len(first.requests)
        while rows < self.max_rows:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self.queue.put(None)  # stop after this batch
                break
            if rows + len(job.requests) > self.max_rows:
                self._carry = job
                break
            jobs.append(job)
            rows += len(job.requests)
        return jobs

    def _generate(self, model: str, jobs: list[Job]) -> None:
        live = [j for j in jobs if not j.cancelled]
        rows: list[tuple[Job, int]] = [(j, c) for j in live for c in range(len(j.requests))]
        requests = [j.requests[c] for j, c in rows]

        def on_step(indices, tokens, logprobs, tops) -> None:
            for k, (i, token, lp) in enumerate(zip(indices, tokens, logprobs)):
                job, choice = rows[i]
                if job.stream and not job.cancelled:
                    job.events.put(("token", choice, token, lp, tops[k] if tops else None))

        try:
            if not requests:
                return
            with self.adapters.use(model):  # weights are replaced only between batches
                version = self.label()
                streaming = any(j.stream for j in live)
                out = self.engine.generate(requests, on_step=on_step if streaming else None)
        except BaseException as err:  # answered to the waiting requests, not lost
            for job in live:
                job.events.put(("error", err))
            if not isinstance(err, Exception):
                raise
            return
        at = 0
        for job in live:
            job.events.put(("done", out[at:at + len(job.requests)], version))
            at += len(job.requests)


def completion_usage(completions: list[Any]) -> tuple[int, int]:
    """(prompt tokens, counted once; completion tokens over all choices)."""
    return len(completions[0].prompt_ids), sum(len(c.completion_ids) for c in completions)
