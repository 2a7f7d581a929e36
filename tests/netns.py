"""Test hosts in network namespaces a test makes and removes itself, for cutting the network
between a cluster's processes for real.

Each host (etcd, a node, a gateway) gets a namespace of its own with one address on a bridge,
and the bridge lives in a namespace of its own too: nothing is added to the machine's own
network, and no packet can leave it. The addresses (10.231.N.0/24, N random per run) exist
only inside these namespaces. A partition is a set of nftables rules inside the hosts cut
off: their packets to and from the other side are dropped, so connections stay open and
unanswered, as in a real cut (no reset tells anyone). Healing removes the rules.

Clients in the test process reach a host by running in a thread that has entered the host's
namespace (`Net.thread`): a network namespace belongs to a thread, and a socket keeps the
namespace it was made in. Processes are started in a namespace with `ip netns exec`.

Needs root (CI runs as root), iproute2 (`ip`) and nftables (`nft`).
"""

import ctypes
import os
import random
import secrets
import shutil
import subprocess
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def available():
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (install iproute2 and nftables)"
    return None


def _run(*argv, input=None):
    r = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def enter(ns):
    """Moves the calling thread into namespace `ns` (sockets it makes from now on are there)."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns {ns}: {os.strerror(e)}")
    finally:
        os.close(fd)


class Net:
    """A bridge and the hosts on it; `close` removes every namespace it made."""

    def __init__(self):
        self.tag = "pr" + secrets.token_hex(2)
        self.prefix = f"10.231.{random.randint(1, 254)}."
        self.switch = f"{self.tag}-sw"
        self.hosts = {}  # name -> (namespace, address)
        self.cut_hosts = set()
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")

    def host(self, name):
        """A new host `name`: its address."""
        i = len(self.hosts) + 1
        ns = f"{self.tag}-{name}"
        addr = f"{self.prefix}{i}"
        port = f"v{self.tag}{i}"
        _run("ip", "netns", "add", ns)
        self.hosts[name] = (ns, addr)
        _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
             "netns", ns)
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        return addr

    def ns(self, name):
        return self.hosts[name][0]

    def addr(self, name):
        return self.hosts[name][1]

    def exec_prefix(self, name):
        """The argv prefix that runs a command on host `name`."""
        return ["ip", "netns", "exec", self.ns(name)]

    def cut(self, side, rest):
        """Drops every packet between the hosts of `side` and those of `rest`, both ways."""
        for host, others in [(h, rest) for h in side] + [(h, side) for h in rest]:
            self._cut_one(host, ", ".join(self.addr(o) for o in others))

    def _cut_one(self, host, peers):
        rules = (
            "add table inet packrat_cut\n"
            "add chain inet packrat_cut in { type filter hook input priority 0; }\n"
            "add chain inet packrat_cut out { type filter hook output priority 0; }\n"
            f"add rule inet packrat_cut in ip saddr {{ {peers} }} drop\n"
            f"add rule inet packrat_cut out ip daddr {{ {peers} }} drop\n"
        )
        _run(*self.exec_prefix(host), "nft", "-f", "-", input=rules)
        self.cut_hosts.add(host)

    def heal(self):
        for host in sorted(self.cut_hosts):
            _run(*self.exec_prefix(host), "nft", "delete", "table", "inet", "packrat_cut")
        self.cut_hosts.clear()

    def enter(self, name):
        """Moves the calling thread onto host `name`."""
        enter(self.ns(name))

    def thread(self, name, target, *args):
        """A started thread that runs `target(*args)` on host `name`; its result or exception
        is kept on the thread (`.result`, `.error`)."""

        def body():
            try:
                self.enter(name)
                t.result = target(*args)
            except BaseException as e:  # handed to whoever joins the thread
                t.error = e

        t = threading.Thread(target=body, daemon=True)
        t.result, t.error = None, None
        t.start()
        return t

    def call(self, name, target, *args, timeout=120):
        """`target(*args)` on host `name`: its result (its exception is raised here)."""
        t = self.thread(name, target, *args)
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError(f"{target.__name__} on {name} took over {timeout} s")
        if t.error is not None:
            raise t.error
        return t.result

    def close(self):
        for ns, _ in self.hosts.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True, timeout=30)
