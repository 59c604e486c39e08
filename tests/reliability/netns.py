"""Hosts of a test's own: each a network namespace, joined to the root namespace by a bridge.

:class:`Network` makes a bridge with a random ``10.x.y.0/24`` and names with a random suffix (two
runs at once cannot collide); :meth:`Network.add_host` makes a namespace whose ``eth0`` is a veth
on that bridge. The faults are nftables rules in the host's own namespace (removed with it):
:meth:`Host.partition` drops every packet in and out of ``eth0``, :meth:`Host.lose` a random share
of them. Latency goes through :class:`DelayProxy`, a TCP relay in the root namespace that holds
each chunk for a while: this machine's kernel has no ``netem`` qdisc (nor ``fq``, for a BPF
delay), so ``tc qdisc ... netem delay`` is not available.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

#: The table of every fault rule, in the host's namespace.
FAULT_TABLE = "pgoutbox_fault"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, check=check, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


def skip_unless_namespaces() -> None:
    """Skip the test, saying why, unless this process can make namespaces, veths and rules."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"no `{tool}` command (iproute2 / nftables) to build the hosts")
    probe = f"pgoprobe{secrets.token_hex(3)}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
    try:
        rule = run(
            "ip", "netns", "exec", probe, "nft", "add", "table", "inet", FAULT_TABLE, check=False
        )
        if rule.returncode != 0:
            pytest.skip(f"cannot add nftables rules in a namespace: {rule.stderr.strip()}")
    finally:
        run("ip", "netns", "del", probe, check=False)


class Host:
    """One namespace: ``address`` on the bridge, its processes started by :meth:`popen`."""

    def __init__(self, name: str, address: str, veth: str) -> None:
        self.name = name
        self.address = address
        self.veth = veth  # the root side of its veth pair

    def exec(self, *argv: str) -> None:
        run("ip", "netns", "exec", self.name, *argv)

    def popen(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **options)

    def _rules(self, *rules: str) -> None:
        self.heal()
        script = [
            f"add table inet {FAULT_TABLE}",
            f"add chain inet {FAULT_TABLE} out {{ type filter hook output priority 0 ; }}",
            f"add chain inet {FAULT_TABLE} in {{ type filter hook input priority 0 ; }}",
            *rules,
        ]
        subprocess.run(
            ["ip", "netns", "exec", self.name, "nft", "-f", "-"],
            input="\n".join(script) + "\n",
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def partition(self) -> None:
        """Drop every packet to and from the bridge: the host is cut off, silently (no RST)."""
        self._rules(
            f'add rule inet {FAULT_TABLE} out oifname "eth0" drop',
            f'add rule inet {FAULT_TABLE} in iifname "eth0" drop',
        )

    def lose(self, percent: float) -> None:
        """Drop ``percent`` % of the packets each way, at random."""
        per_100k = round(percent * 1000)
        self._rules(
            f'add rule inet {FAULT_TABLE} out oifname "eth0" numgen random mod 100000 < {per_100k}'
            " drop",
            f'add rule inet {FAULT_TABLE} in iifname "eth0" numgen random mod 100000 < {per_100k}'
            " drop",
        )

    def heal(self) -> None:
        """Remove every fault rule of this host."""
        run("ip", "netns", "exec", self.name, "nft", "delete", "table", "inet", FAULT_TABLE,
            check=False)  # fmt: skip


class Network:
    """A bridge in the root namespace, ``gateway`` its address, and the hosts on it."""

    def __init__(self) -> None:
        self.suffix = secrets.token_hex(3)
        rng = random.SystemRandom()
        self.prefix = f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 250)}"
        self.subnet = f"{self.prefix}.0/24"
        self.gateway = f"{self.prefix}.1"
        self.bridge = f"pgobr{self.suffix}"
        self.hosts: list[Host] = []

    def create(self) -> None:
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")

    def add_host(self) -> Host:
        index = len(self.hosts)
        name = f"pgo{self.suffix}h{index}"
        veth, peer = f"pgv{self.suffix}{index}", f"pgp{self.suffix}{index}"
        host = Host(name, f"{self.prefix}.{10 + index}", veth)
        run("ip", "netns", "add", name)
        self.hosts.append(host)
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        run("ip", "link", "set", peer, "netns", name)
        run("ip", "link", "set", veth, "master", self.bridge)
        run("ip", "link", "set", veth, "up")
        host.exec("ip", "link", "set", "lo", "up")
        host.exec("ip", "link", "set", peer, "name", "eth0")
        host.exec("ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
        host.exec("ip", "link", "set", "eth0", "up")
        return host

    def destroy(self) -> None:
        for host in self.hosts:
            run("ip", "netns", "del", host.name, check=False)  # its veth pair and rules with it
            run("ip", "link", "del", host.veth, check=False)
        run("ip", "link", "del", self.bridge, check=False)


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A bridge of its own, removed with its hosts at the end (also when the test fails)."""
    skip_unless_namespaces()
    net = Network()
    try:
        net.create()
        yield net
    finally:
        net.destroy()


class DelayProxy:
    """A TCP relay on ``listen``:``port`` to ``target``: each chunk each way waits ``delay / 2``
    seconds (the round trip is ``delay`` longer), in order. Set ``delay`` at any time."""

    def __init__(self, listen: str, target: tuple[str, int]) -> None:
        self.listen = listen
        self.target = target
        self.delay = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        self.port = future.result(timeout=30)

    async def _serve(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.listen, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.ensure_future(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await source.read(65536)
                await queue.put((time.monotonic() + self.delay / 2, data))
                if not data:
                    break
            await delivering
        except (OSError, asyncio.CancelledError):
            delivering.cancel()
        finally:
            with contextlib.suppress(Exception):
                sink.close()

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class HostWorker:
    """``manage.py runworkers`` on a host: started through ``ip netns exec``, killed at the end."""

    def __init__(
        self,
        host: Host,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        cwd: Path,
        application: str,
    ) -> None:
        self.host = host
        #: Its connections' ``application_name`` (``PGAPPNAME``), to find them on the server.
        self.application = application
        self.log_path = log
        self._log: IO[str] = log.open("w")
        die_with_the_test = (
            ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        )
        self.process = host.popen(
            [*die_with_the_test, *argv],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        self._log.close()
