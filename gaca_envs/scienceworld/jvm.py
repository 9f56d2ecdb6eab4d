"""ScienceWorld engines that share JVMs, each engine in a class loader of its own.

The ``scienceworld`` package starts a JVM (py4j) per env. A JVM costs 200-800 MB, so 128
live episodes would need 30-100 GB. Here up to ``envs_per_jvm`` engines of one process
share a JVM (:func:`acquire`), without sharing state: the engine keeps state in Scala
singletons (``scala.util.Random``, which every load seeds and every bee draws from; the
object-id counter ``UniqueIdentifier``; the type-id table ``UniqueTypeID``; the list of
active simplifications), and two engines of one class loader would step on each other's.
Each engine therefore loads the engine's jar (the Scala library included) in its own
``URLClassLoader`` whose parent is the JVM's platform loader: every singleton is its own,
as in a JVM of its own.

Each engine also talks to the JVM over its own py4j client. py4j caches the methods it
has looked up per Java thread, keyed by class *name*; one engine's classes share their
names with every other engine's, so calls of two engines on one thread would find each
other's methods. A client's connections are served by Java threads of their own.

A JVM that dies fails only its engines: their calls raise py4j errors, and the env makes
a new engine (on a live JVM) at its next reset. A JVM is shut down when its last engine
closes.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import tempfile
import threading
from typing import Any

#: Engines per JVM by default: the collector's slots of one worker when 128 live episodes
#: run in 8 workers (then 5.9 GB in all, workers and JVMs: docs/benchmarks.md).
ENVS_PER_JVM = 16
#: The JVM's heap by default (``-Xmx``): a base plus a share per engine it may hold.
HEAP_BASE_MB, HEAP_PER_ENV_MB = 192, 64
#: Options for every engine JVM. ``hashCode=2`` makes every identity hash code 1: the
#: engine iterates hash sets of its objects, and with HotSpot's default hash (a generator
#: per Java thread) their order -- so where bees fly, which object a gold path names --
#: depended on the thread's and the JVM's past (grow-fruit's world changed from step 14
#: between two fresh JVMs of different layouts). With a constant hash the order follows
#: from what was put in a set alone: an engine plays the same in any JVM, shared or not,
#: given the same history (one carry-over inside an engine remains: the env card's
#: Determinism). The collector stays the JVM's default (G1): with the serial one
#: chemistry-mix's gold path names another object. The heap is handed back to the system
#: when less than 70% of it is used.
JVM_OPTIONS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2",
               "-XX:MinHeapFreeRatio=10", "-XX:MaxHeapFreeRatio=30")
_HEAP_RE = re.compile(r"^[1-9][0-9]*[kKmMgG]?$")
_MAIN = "scienceworld.runtime.pythonapi.PythonInterface"


def check_heap(jvm_heap: str | None) -> str | None:
    """``jvm_heap`` as ``-Xmx`` takes it (``768m``, ``2g``), ``"auto"`` (sized by
    :func:`auto_heap`) or None (the JVM's own default: a quarter of the machine)."""
    if jvm_heap is None or jvm_heap == "auto":
        return jvm_heap
    heap = str(jvm_heap).strip()
    if not _HEAP_RE.match(heap):
        raise ValueError(f"jvm_heap must be a size such as 768m or 2g, 'auto' or None (the "
                         f"JVM's default), got {jvm_heap!r}")
    return heap


def check_envs_per_jvm(envs_per_jvm: int) -> int:
    if isinstance(envs_per_jvm, bool) or not isinstance(envs_per_jvm, int) or envs_per_jvm < 1:
        raise ValueError(f"envs_per_jvm must be an integer >= 1, got {envs_per_jvm!r}")
    return envs_per_jvm


def auto_heap(envs_per_jvm: int) -> str:
    """The heap of a JVM that holds ``envs_per_jvm`` engines."""
    return f"{HEAP_BASE_MB + HEAP_PER_ENV_MB * envs_per_jvm}m"


def java_options(jvm_heap: str | None, envs_per_jvm: int) -> list[str]:
    heap = auto_heap(envs_per_jvm) if jvm_heap == "auto" else jvm_heap
    return [*JVM_OPTIONS, *([f"-Xmx{heap}"] if heap else [])]


class Engine:
    """One engine (``PythonInterface``) in its own class loader, on a shared JVM."""

    def __init__(self, host: "JvmHost") -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway

        self.host = host
        self._client = JavaGateway(gateway_parameters=GatewayParameters(
            port=host.port, auto_field=True, auto_convert=False))
        self._tmp = tempfile.mkdtemp(prefix="gaca-sw-")
        try:
            self.server = self._new_interface()
        except Exception:
            self._drop()
            raise

    def _new_interface(self):
        jvm, new_array = self._client.jvm, self._client.new_array
        urls = new_array(jvm.java.net.URL, 1)
        urls[0] = jvm.java.io.File(self.host.jar).toURI().toURL()
        loader = jvm.java.net.URLClassLoader(urls, jvm.java.lang.ClassLoader
                                             .getPlatformClassLoader())
        cls = loader.loadClass(_MAIN)
        return cls.getDeclaredConstructor(new_array(jvm.java.lang.Class, 0)) \
            .newInstance(new_array(jvm.java.lang.Object, 0))

    @property
    def pid(self) -> int:
        return self.host.pid

    def alive(self) -> bool:
        return self.host.alive()

    def getObjectTree(self) -> dict:
        """The engine's object tree (it writes it as JSON into a folder of ours)."""
        msg = self.server.getObjectTree(self._tmp)
        if msg:
            raise RuntimeError(str(msg))
        with open(os.path.join(self._tmp, "objectTree.json")) as f:
            return json.load(f)

    def _drop(self) -> None:
        self.server = None
        disconnect(self._client)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def close(self) -> None:
        if self.host is None:
            return
        self._drop()
        host, self.host = self.host, None
        _release(host, self)


def disconnect(client) -> None:
    """Close a py4j client for good. The engine's proxies are freed first, while the JVM
    can still hear it (py4j frees a proxy's Java object from a finalizer, and proxies hold
    cycles: the cyclic collector would run those finalizers at a random later moment, some
    after the JVM has gone, each then trying to reconnect). Marked disconnected, the
    client's finalizers left over do nothing."""
    gc.collect()
    gateway_client = client._gateway_client
    try:
        gateway_client.close()
    except Exception:  # noqa: BLE001 - a dead JVM: nothing left to close
        pass
    gateway_client.is_connected = False


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has), by the kernel."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    try:  # no /proc (macOS): a signal 0 tells whether the pid exists
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def process_alive(proc) -> bool:
    """Whether a JVM's ``Popen`` still runs. py4j's ProcessConsumer thread sits in this
    process's wait(); while it does, poll() cannot take the wait lock and answers None
    even for a JVM that has died and been reaped, so the kernel is asked as well."""
    return proc.poll() is None and running(proc.pid)


class JvmHost:
    """One engine JVM (py4j's gateway server with the engine's jar)."""

    def __init__(self, jvm_heap: str | None, envs_per_jvm: int) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
        from scienceworld.constants import BASEPATH, JAR_PATH

        self.jar, self.capacity = JAR_PATH, envs_per_jvm
        self.engines: list[Engine] = []
        # cwd: the engine reads its type-id table (object_type_ids.tsv) from there
        self.port, self._proc = launch_gateway(
            classpath=JAR_PATH, cwd=BASEPATH, die_on_exit=True, return_proc=True,
            javaopts=java_options(jvm_heap, envs_per_jvm))
        self._gateway = JavaGateway(gateway_parameters=GatewayParameters(port=self.port),
                                    java_process=self._proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return process_alive(self._proc)

    def shutdown(self) -> None:
        if self.alive():
            try:
                self._gateway.shutdown()
            except Exception:  # noqa: BLE001 - it died meanwhile
                pass
        self._gateway._gateway_client.is_connected = False
        try:  # die_on_exit: the JVM leaves when its stdin ends
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - it would not leave
            self._proc.kill()
            self._proc.wait()


_HOSTS: dict[tuple, list[JvmHost]] = {}
_LOCK = threading.Lock()


def acquire(jvm_heap: str | None = "auto", envs_per_jvm: int = ENVS_PER_JVM) -> Engine:
    """An engine on a live JVM of this process with room left (started if none has)."""
    key = (jvm_heap, envs_per_jvm)
    with _LOCK:
        hosts = _HOSTS.setdefault(key, [])
        host = next((h for h in hosts if h.alive() and len(h.engines) < h.capacity), None)
        if host is None:
            host = JvmHost(jvm_heap, envs_per_jvm)
            hosts.append(host)
        try:
            engine = Engine(host)
        except Exception:
            if not host.engines:  # a JVM of no engine is not kept
                hosts.remove(host)
                host.shutdown()
            raise
        host.engines.append(engine)
        return engine


def _release(host: JvmHost, engine: Engine) -> None:
    with _LOCK:
        if engine in host.engines:
            host.engines.remove(engine)
        if host.engines:
            return
        for hosts in _HOSTS.values():
            if host in hosts:
                hosts.remove(host)
    host.shutdown()


def hosts() -> list[Any]:
    """This process's engine JVMs (for tests and benchmarks)."""
    with _LOCK:
        return [h for group in _HOSTS.values() for h in group]
