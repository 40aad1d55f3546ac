"""The Ray executor (`--executor ray`): every pair one Ray task, on any node of a cluster.

Driver (this process):
- `connect` reaches the cluster within `CONNECT_TIMEOUT_S` (a port that does not answer is a one-line
  UsageError, never a hang); `RayCluster.probe` asks one worker what its device is, so that resume
  keys and provenance name the workers' device even when this machine has none.
- Each compiled candidate is built once by a CPU task (`num_cpus=1`, ninja `MAX_JOBS=1`, so that
  builds never ask more of a node than its CPUs), into the cache of the node that ran it (by content
  hash, as locally). A pair's task waits for its build and needs `num_gpus=1` (`num_cpus=1` on
  `--device cpu`); Ray picks the node, so pairs start as their builds finish, in whatever order.
  Where pairs need GPUs and the cluster has CPU-only nodes (alive when the run starts), each build
  goes to one of those, the one with the fewest builds outstanding per CPU (soft node affinity: a
  build waits for that node's CPUs, and moves elsewhere only if the node is lost), so GPU nodes take
  the pairs and keep their CPUs for them. Ray alone would not keep it so: its preference for
  CPU-only nodes (`scheduler_avoid_gpu_nodes`) gives way once they are half busy, and builds then
  land on GPU nodes (seen in the test). `tests/executors/test_executors_ray.py` shows the placement
  on two local nodes, one declaring a GPU. Without CPU-only nodes, Ray places builds. A pair that
  lands on a node without its build builds it there, once per node. On a node that does both, builds keep off the cores of its pairs as local lanes do
  (`kbv.placement`; the node's GPUs are its lanes).
- Verdicts come back as the tasks finish; the caller (`kbv.api`) stores them, the only writer.
  Ctrl-C (`abort`) cancels every outstanding task (force: its worker and its children die).

Worker: `_evaluate_on_worker` runs the local executor's lane for that one pair: the same sandbox code,
children, stages and verdict, with a run directory of its own under the node's temporary directory and
the node's build cache (`$KBV_CACHE_DIR`, else `~/.cache/kbv`). The problem and the candidate arrive by
value, in the Job. GPU workers serve one task each (Ray's default for GPU tasks, so that no CUDA
context or memory outlives a pair), so each pair prepares its problem on its worker: that is what a
pair costs more under Ray than in a local lane, which prepares a problem once.

The secret: made by the driver (`kbv.api`), passed as a task argument of its own (32 bytes, so Ray
keeps it inline in the task's spec: never in the object store, never spilled to disk), never logged.
The worker hands it to the verified runner in its own memory; children get kbv's scrubbed environment
and a directory that holds no secret (`kbv.sandbox.parent.child_env`). The rules travel as
`kbv.api.RunnerRecipe`, without the seed.

Failures: a task whose worker or node is lost, or that raised, is run again once by Ray
(`max_retries=1`); a second failure makes the pair `crashed` with Ray's reason. A ProblemError comes
back as data and is raised again here, as locally.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kbv.builds import BuildOptions, build_candidate, build_key, needs_build
from kbv.errors import ProblemError, UsageError
from kbv.executors import Executor, Job, ProtocolRunner, RunState
from kbv.settings import Settings, default_cache_dir
from kbv.verdict import Status, Verdict

INSTALL = "pip install 'kernelbench-verified[ray]'"
CONNECT_TIMEOUT_S = 60.0  # reaching the cluster and joining it
PROBE_TIMEOUT_S = 600.0  # one worker describing its device (a busy cluster queues the probe)
ATTEMPTS = 2  # a task is run again once after its worker, its node or kbv on it failed
# this run's workers (the parents of its children): idle OpenMP threads sleep, as in `kbv.cli.main`
WORKER_ENV = {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
DRIVER_ONLY = ("verified_seed",)  # provenance that stays here (a fixed --seed is the secret itself)


def import_ray() -> Any:
    """The `ray` module, or a UsageError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise UsageError(f"--executor ray needs Ray, an optional extra: {INSTALL}") from exc
    return ray


@dataclass(frozen=True)
class RayCluster:
    """A connected cluster: the `ray` module, and what we told it."""

    ray: Any
    address: str

    def probe(self, device: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
        """`--device` on this cluster: {"device": "cuda:0" | "cpu" (as a worker sees it), "provenance",
        "cuda_arch_list"}, from one worker. Raises UsageError when the cluster cannot run it, or runs
        another kbv."""
        import kbv

        kind = _device_kind(device, float(self.ray.cluster_resources().get("GPU", 0)))
        task = self.ray.remote(max_retries=ATTEMPTS - 1, **_resources(kind))(_describe_worker)
        ref = task.remote(kind)
        ready, _ = self.ray.wait([ref], timeout=min(timeout_s, PROBE_TIMEOUT_S))
        if not ready:
            self.ray.cancel(ref, force=True)
            raise UsageError(f"Ray cluster {self.address}: no worker with a {kind.upper()} free within "
                             f"{min(timeout_s, PROBE_TIMEOUT_S):.0f} s.")
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            raise UsageError(f"Ray cluster {self.address}: a worker cannot run kbv: {_first_line(exc)} "
                             "(every node needs kbv installed, with torch)") from exc
        if info["kbv"] != kbv.__version__:
            raise UsageError(f"Ray cluster {self.address}: its workers run kbv {info['kbv']}, this driver "
                             f"kbv {kbv.__version__}: install the same kbv on every node.")
        return info


def _cpu_only_nodes(ray: Any) -> dict[str, tuple[float, int]]:
    """The cluster's live nodes with CPUs and no GPU: node id -> (CPUs, 0 builds outstanding)."""
    nodes = {}
    for node in ray.nodes():
        res = node.get("Resources", {})
        if node.get("Alive") and res.get("CPU", 0) > 0 and not res.get("GPU"):
            nodes[node["NodeID"]] = (float(res["CPU"]), 0)
    return nodes


def _device_kind(device: str, gpus: float) -> str:
    requested = device.strip().lower()
    if requested == "auto":
        return "cuda" if gpus >= 1 else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if gpus < 1:
            raise UsageError("--device cuda: the Ray cluster has no GPU (use --device cpu or auto).")
        return "cuda"
    if requested.startswith("cuda:"):
        raise UsageError(f"--device {device}: under --executor ray, Ray gives each pair a GPU; use --device cuda.")
    raise UsageError(f"Unknown device '{device}': expected auto, cpu or cuda.")


def _resources(kind: str) -> dict[str, float]:
    return {"num_gpus": 1} if kind == "cuda" else {"num_cpus": 1}


@contextlib.contextmanager
def connect(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> Iterator[RayCluster]:
    """Join the cluster at `address` ('auto': the one running on this machine; 'HOST:PORT' of its head;
    'ray://HOST:PORT', its Ray Client server; None: a running local one, else a new one started for
    this run and stopped after it). Disconnects on exit. Raises UsageError, within about `timeout_s`,
    when there is no cluster there."""
    ray = import_ray()
    shown = address or "(local)"
    if address not in (None, "auto"):
        _check_port(address, min(timeout_s, 10.0))
    _init(ray, address, shown, timeout_s)
    try:
        with ray_messages_on_stderr(ray):
            yield RayCluster(ray, shown)
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_messages_on_stderr(ray: Any) -> Iterator[None]:
    """Ray prints the errors its raylets send a driver ("a worker died ...", "retrying") on the
    driver's stdout, where kbv writes its table or JSON: for the block, they go to stderr. Ray has no
    option for it; where its private printer is not found, nothing changes."""
    module = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(module, "print_to_stdstream", None)
    if original is None:
        yield
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    module.print_to_stdstream = to_stderr
    try:
        yield
    finally:
        module.print_to_stdstream = original


def _check_port(address: str, timeout_s: float) -> None:
    """A TCP connection to HOST:PORT, so that an address where nothing listens fails at once (Ray
    itself retries such an address for minutes)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--ray-address {address}: expected auto, HOST:PORT or ray://HOST:PORT.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UsageError(f"--ray-address {address}: no Ray cluster answers there ({exc.strerror or exc}).") from None


def _init(ray: Any, address: str | None, shown: str, timeout_s: float) -> None:
    """`ray.init`, given `timeout_s` to join a cluster: a port that accepts but is not Ray would hang
    it, so it runs on a daemon thread and a timeout leaves it behind. A Ray that may be started here
    (no address) is started on this thread: Ray's processes die with the thread that started them."""
    outcome: dict[str, BaseException | None] = {}

    def join() -> None:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, include_dashboard=False,
                     runtime_env=WORKER_ENV)
            outcome["error"] = None
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    if address is None:
        join()
    else:
        thread = threading.Thread(target=join, name="kbv-ray-connect", daemon=True)
        thread.start()
        thread.join(timeout_s)
    if "error" not in outcome:
        raise UsageError(f"--ray-address {shown}: the cluster did not let us join within {timeout_s:.0f} s.")
    error = outcome["error"]
    if error is not None:
        hint = " (start one with `ray start --head`)" if address == "auto" else ""
        raise UsageError(f"--ray-address {shown}: cannot join the Ray cluster: {_reason(error)}{hint}") from None


def _reason(exc: BaseException) -> str:
    """The first line of `exc`, or of what caused it when that says more (Ray wraps a cluster's
    demand for a token, `RAY_AUTH_MODE=token`, in a bare "Failed to connect")."""
    seen: BaseException | None = exc
    while seen is not None:
        if "Authentication" in type(seen).__name__:
            return _first_line(seen)
        seen = seen.__cause__ or seen.__context__
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


class RayExecutor(Executor):
    """Pairs as Ray tasks. `runners` are the driver's (fingerprints, blank verdicts); workers make their
    own from `recipe` (`kbv.api.RunnerRecipe`) and `secret`."""

    def __init__(self, cluster: RayCluster, settings: Settings, runners: dict[str, ProtocolRunner],
                 recipe: Any, secret: bytes) -> None:
        ray = self._ray = cluster.ray
        self.settings = settings
        self.runners = runners
        self._secret = secret  # a task argument of its own, never in an object put in the store
        retries = {"max_retries": ATTEMPTS - 1, "retry_exceptions": True}
        self._pair_task = ray.remote(**retries, **_resources(settings.device_type))(_evaluate_on_worker)
        self._build_task = ray.remote(num_cpus=1, **retries)(_build_on_node)
        self._recipe = ray.put(recipe)
        self._settings = ray.put(replace(settings, provenance={k: v for k, v in settings.provenance.items()
                                                               if k not in DRIVER_ONLY}))
        self._provenance = {k: settings.provenance[k] for k in DRIVER_ONLY if k in settings.provenance}
        self._builds: dict[str, Any] = {}  # build key -> the ref of its build task
        self._built: dict[str, dict[str, Any]] = {}  # build key -> what its task said (node, cpu_s, cached)
        self._build_started: dict[str, float] = {}  # build key -> when it was submitted (outstanding)
        self._refs: dict[Any, Job] = {}  # outstanding pair tasks
        self._lock = threading.Lock()
        # CPU-only nodes -> (CPUs, builds outstanding there), where pairs take GPUs
        self._build_nodes = _cpu_only_nodes(ray) if "num_gpus" in _resources(settings.device_type) else {}
        self._build_node_of: dict[str, str] = {}  # build key -> the node it was sent to
        resources = ray.cluster_resources()
        self.lanes = max(1, int(resources.get("GPU" if settings.device_type == "cuda" else "CPU", 1)))

    def submit(self, job: Job) -> Future[Verdict]:
        out: Future[Verdict] = Future()
        cand = job.pair.candidate
        if cand.no_code:  # nothing to run: answered here, as the local lane does
            from kbv.executors.local import no_code_verdict

            out.set_result(no_code_verdict(self.runners[job.protocol], job.pair))
            return out
        with self._lock:
            built = self._build_ref(job) if needs_build(cand) else None
            ref = self._pair_task.remote(job, self._recipe, self._settings, self._secret, built)
            self._refs[ref] = job
        ref.future().add_done_callback(lambda done: self._finished(ref, job, done, out))
        return out

    def _build_ref(self, job: Job) -> Any:
        key = build_key(job.pair.candidate, self.settings)
        if key not in self._builds:
            task = self._build_task.options(**self._build_placement(key))
            ref = self._builds[key] = task.remote(job.pair.candidate, self._settings, key)
            self._build_started[key] = time.monotonic()
            ref.future().add_done_callback(lambda done: self._build_finished(key, done))
        return self._builds[key]

    def _build_placement(self, key: str) -> dict[str, Any]:
        """Task options that send a build to the CPU-only node least loaded per CPU (none: Ray's choice)."""
        if not self._build_nodes:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = min(self._build_nodes, key=lambda n: (self._build_nodes[n][1] / self._build_nodes[n][0], n))
        cpus, outstanding = self._build_nodes[node]
        self._build_nodes[node] = (cpus, outstanding + 1)
        self._build_node_of[key] = node
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True)}

    def _build_finished(self, key: str, done: Future[Any]) -> None:
        try:
            info = done.result()
        except Exception:  # its pairs say what went wrong
            info = {}
        with self._lock:
            self._build_started.pop(key, None)
            self._built[key] = info if isinstance(info, dict) else {}
            node = self._build_node_of.pop(key, None)
            if node in self._build_nodes:
                cpus, outstanding = self._build_nodes[node]
                self._build_nodes[node] = (cpus, max(0, outstanding - 1))

    def state(self) -> RunState:
        now = time.monotonic()
        with self._lock:
            outstanding = dict(self._build_started)
            built = list(self._built.values())
            pairs = len(self._refs)
        oldest = min(outstanding.values(), default=None)
        fresh = [b for b in built if b and not b.get("cached")]
        return RunState(builds_running=len(outstanding), oldest_build_s=now - oldest if oldest else 0.0,
                        oldest_build="(a Ray task)" if oldest else None,
                        evaluating=(f"ray: {pairs} pair tasks outstanding",) if pairs else (),
                        builds_done=len(fresh), builds_cached=sum(1 for b in built if b.get("cached")),
                        build_cpu_s=round(sum(float(b.get("cpu_s", 0.0)) for b in fresh), 2),
                        build_wall_s=round(sum(float(b.get("wall_s", 0.0)) for b in fresh), 2))

    def build_nodes(self) -> dict[str, str]:
        """Build key -> the node that built it (builds finished so far)."""
        with self._lock:
            return {k: str(v.get("node")) for k, v in self._built.items() if v.get("node")}

    def _finished(self, ref: Any, job: Job, done: Future[Any], out: Future[Verdict]) -> None:
        """Runs on Ray's thread: only turns the task's outcome into the verdict future."""
        with self._lock:
            self._refs.pop(ref, None)
        try:
            kind, value = done.result()
        except self._ray.exceptions.TaskCancelledError:
            out.cancel()
            return
        except Exception as exc:  # lost twice (worker, node, memory), or kbv raised on it twice
            out.set_result(self._crashed(job, exc))
            return
        if kind == "problem_error":
            out.set_exception(value)
        else:
            out.set_result(replace(value, provenance={**value.provenance, **self._provenance}))

    def _crashed(self, job: Job, exc: BaseException) -> Verdict:
        return replace(self.runners[job.protocol].blank(job.pair), status=Status.CRASHED,
                       message=f"the Ray task failed {ATTEMPTS} times ({type(exc).__name__}: {_first_line(exc)})",
                       evidence={"ray_error": str(exc)[-4000:]})

    def abort(self) -> None:
        """Cancel every outstanding task; a running one's worker is killed, and its children with it."""
        with self._lock:
            refs = list(self._refs) + list(self._builds.values())
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)

    def close(self) -> None:
        self.abort()  # nothing is outstanding after a finished run; after an interrupt, nothing may run on


# -- on the workers ------------------------------------------------------------------------------------

def _describe_worker(kind: str) -> dict[str, Any]:
    """A worker's device as kbv sees it (run as a task with that device's resources)."""
    import kbv
    from kbv.provenance import collect_provenance
    from kbv.settings import cuda_arch_list

    from kbv.sandbox.isolation import SandboxMode, resolve

    device = "cuda:0" if kind == "cuda" else "cpu"  # Ray shows the task its GPU alone
    return {"kbv": kbv.__version__, "device": device, "provenance": collect_provenance(device),
            "cuda_arch_list": cuda_arch_list(device),
            "sandbox": resolve(SandboxMode.AUTO, (Path(tempfile.gettempdir()), default_cache_dir())).record()}


@contextlib.contextmanager
def _worker_dirs(settings: Settings) -> Iterator[Settings]:
    """`settings` with this node's build cache and a fresh run directory, removed afterwards (and,
    by a later task, if its worker was killed first)."""
    parent = Path(tempfile.gettempdir()) / "kbv-ray"
    parent.mkdir(exist_ok=True)
    _remove_orphans(parent)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent))
    cache = default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    from kbv.sandbox.isolation import SandboxMode, resolve

    try:  # this node's children are isolated as this node can (the driver checked --sandbox strict)
        isolation = resolve(SandboxMode.parse(settings.sandbox), (run_dir, cache.resolve()))
        yield replace(settings, run_dir=run_dir, cache_dir=cache.resolve(), jobs=1, isolation=isolation,
                      provenance={**settings.provenance, **isolation.record()})
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _remove_orphans(parent: Path) -> None:
    """Remove the run directories (`PID-...`) of workers that no longer run: killed or cancelled."""
    for entry in parent.iterdir():
        pid = entry.name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:  # another user's worker, alive
            pass


def _node_lanes() -> int:
    """The GPUs of this node (its lanes, for `kbv.placement`): a task sees only its own."""
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


def _task_lane() -> int:
    """This task's GPU among the node's (0 without one)."""
    import ray

    ids = ray.get_gpu_ids()
    try:
        return int(ids[0]) if ids else 0
    except (TypeError, ValueError):
        return 0


def _build_on_node(candidate: Any, settings: Settings, key: str) -> dict[str, Any]:
    """Build `candidate` into this node's cache (a CPU task): {"node", "cpu_s", "wall_s", "cached"}.
    It runs on a thread of its own, on the node's build cores at the lowest priority (a thread's
    priority cannot be raised again, and Ray reuses its workers)."""
    import ray

    from kbv.placement import current_plan, enter_build_thread

    plan = current_plan(settings.build_isolation, _node_lanes(), settings.device_type)
    out: dict[str, Any] = {}

    def build() -> None:
        enter_build_thread(plan)
        with _worker_dirs(settings) as here:
            try:
                out["build"] = build_candidate(candidate, here, key[:12], BuildOptions(ninja_jobs=1))
            except BaseException as exc:  # raised again on the task's thread
                out["error"] = exc

    thread = threading.Thread(target=build, name="kbv-build")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    built = out["build"]
    return {"node": str(ray.get_runtime_context().get_node_id()), "cpu_s": built.cpu_s, "wall_s": built.wall_s,
            "cached": built.cached}


def _evaluate_on_worker(job: Job, recipe: Any, settings: Settings, secret: bytes, built: Any) -> tuple[str, Any]:
    """One pair on this worker, by the local executor's lane: ("verdict", Verdict), or
    ("problem_error", the ProblemError). `built` (what its build said) only orders the task after it.
    The lane is the task's GPU on this node, for its cores."""
    import ray

    from kbv.builds import BuildPool
    from kbv.executors.local import LocalExecutor
    from kbv.placement import current_plan, lane_settings
    from kbv.provenance import collect_provenance

    device = "cuda:0" if settings.device_type == "cuda" else "cpu"
    node = str(ray.get_runtime_context().get_node_id())
    with _worker_dirs(settings) as here:
        here = replace(here, device=device, provenance={**here.provenance, **collect_provenance(device),
                                                        "host": platform.node(), "ray_node": node})
        plan = current_plan(here.build_isolation, _node_lanes(), here.device_type)
        lane_index = _task_lane()
        here = lane_settings(here, plan, lane_index)
        builds = BuildPool(here, plan)
        lane = LocalExecutor(here, recipe.make(here, secret), builds, lane=lane_index)
        try:
            return "verdict", lane.submit(job).result()
        except ProblemError as exc:
            return "problem_error", exc
        finally:
            lane.close()
            builds.shutdown(wait=True)
