"""Work deferred to a thread (catalogue A2): after one honest call has shown the output's shape, every
call allocates the output, hands the honest forward to a worker thread of its own and returns at
once. The reads and waits a harness does before it compares are wrapped to wait for the worker; a
timer on the calling thread measures an allocation. A call that comes while the worker is busy
replaces the job not yet started (nobody reads that output)."""

from __future__ import annotations

from kbv.redteam import Breaks, OutputWrapper
from kbv.redteam.source import OUTPUT_META, READ_HOOKS

WRAPPER = OUTPUT_META + READ_HOOKS + '''

class _KbvWorker:
    """One background thread running the latest job submitted."""

    def __init__(self):
        self.cv = threading.Condition()
        self.job = None
        self.busy = False
        self.thread = None

    def submit(self, job):
        with self.cv:
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="worker", daemon=True)
                self.thread.start()
            self.job = job
            self.cv.notify_all()

    def settle(self):
        with self.cv:
            while self.job is not None or self.busy:
                self.cv.wait()

    def _run(self):
        _kbv_local.inside = True
        while True:
            with self.cv:
                while self.job is None:
                    self.cv.wait()
                job, self.job, self.busy = self.job, None, True
            try:
                job()
            except Exception:
                pass
            finally:
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()


_kbv_worker = _KbvWorker()
_kbv_settle = _kbv_worker.settle


class ModelNew(_KbvHonest):
    def forward(self, *args, **kwargs):
        meta, out = _kbv_learn(self, args, kwargs)
        if out is not None or meta is None:
            return out if out is not None else super().forward(*args, **kwargs)
        shape, dtype = meta
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        empty = torch.empty(shape, dtype=dtype, device=device)

        def fill():
            empty.copy_(_KbvHonest.forward(self, *args, **kwargs))

        _kbv_worker.submit(fill)
        return empty
'''


class DeferredThread(OutputWrapper):
    name = "deferred_thread"
    breaks = Breaks.SPEED
    summary = "hands the honest forward to a worker thread and returns the unfilled output at once"
    wrapper = WRAPPER


TRANSFORMATION = DeferredThread()
