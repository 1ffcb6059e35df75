"""A throwaway local Slurm cluster (munge, slurmdbd, slurmctld, N x slurmd) inside a private network namespace.

Every daemon runs in the foreground under a fresh namespace that only has ``lo``, so nothing binds on a real
interface. Configs, state, logs and the fake GPU device nodes live in one temp dir that is removed on exit.
Accounting goes to the MariaDB already on the machine (through its unix socket, which crosses namespaces).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DB_NAME = "slurm_acct_bw"
DB_USER = "slurm_bw"
CLUSTER = "bw"
CTLD_PORT, DBD_PORT, SLURMD_PORT0 = 16817, 16819, 16820
SBIN = "/usr/sbin"


_INSTANCES = itertools.count(1)


class HarnessError(RuntimeError):
    """The local cluster could not be started or a CLI call failed; the message carries the daemon log tails."""


def _tail(path: Path, lines: int = 25) -> str:
    if not path.exists():
        return f"--- {path.name}: (no file)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(text)


class SlurmCluster:
    """Context manager: ``with SlurmCluster(nodes=3) as c: c.sbatch(...)``."""

    def __init__(self, nodes: int = 3, gpus_per_node: int = 4, gpu_type: str = "h100") -> None:
        self.node_names = [f"node{i + 1}" for i in range(nodes)]
        self.gpus_per_node = gpus_per_node
        self.gpu_type = gpu_type
        # One namespace and one accounting database per harness, named by process and instance: two test
        # sessions (a developer's and CI's, or two parallel workers) on one machine, or a module's own cluster
        # beside the session's in one worker, must never read or drop each other's jobs.
        instance = f"{os.getpid()}_{next(_INSTANCES)}"
        self.netns = f"bwslurm{instance}"
        self.db_name = f"{DB_NAME}_{instance}"
        # Per harness too: a shared user's password would be reset under another run's slurmdbd.
        self.db_user = f"{DB_USER}_{instance}"
        self.root = Path(tempfile.mkdtemp(prefix="bw-slurm-"))
        self.root.chmod(0o755)  # munged refuses sockets under group/other-writable dirs; 0700 hides it from jobs
        self.etc, self.log, self.state, self.dev = (self.root / d for d in ("etc", "log", "state", "dev"))
        self.slurm_conf = self.etc / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.host = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.start_seconds: float | None = None

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Bring the whole cluster up; raise HarnessError with the log tails if any part fails."""
        t0 = time.monotonic()
        for d in (self.etc, self.log, self.state, self.dev, self.munge_socket.parent):
            d.mkdir(parents=True, exist_ok=True)
        self._make_netns()
        self._make_gpu_devices()
        self._write_configs()
        self._make_database()
        self._start_munge()
        self._spawn("slurmdbd", [f"{SBIN}/slurmdbd", "-D"])
        self._wait("slurmdbd answers", self._dbd_answers, 30)
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER, check=False)  # slurmctld would add it too, later
        self.run("sacctmgr", "-i", "add", "account", "bwacct", "Description=bw", "Organization=bw")
        self.run("sacctmgr", "-i", "add", "user", "root", "Account=bwacct")
        self._spawn("slurmctld", [f"{SBIN}/slurmctld", "-D", "-i", "-f", str(self.slurm_conf)])
        self._wait("slurmctld answers", lambda: self.run("scontrol", "ping", check=False).returncode == 0, 8)
        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [f"{SBIN}/slurmd", "-D", "-N", name, "-f", str(self.slurm_conf)])
        self._wait("all nodes idle", self._nodes_idle, 30)
        self.start_seconds = time.monotonic() - t0

    def stop(self) -> None:
        """Stop daemons (reverse start order), kill any straggler left in our namespace, delete it and the dir."""
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._kill_namespace_stragglers()
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True, check=False)
        if not os.environ.get("BW_SLURM_KEEP"):  # BW_SLURM_KEEP=1 keeps configs, logs and the DB for a post-mortem
            shutil.rmtree(self.root, ignore_errors=True)
            drop = f"DROP DATABASE IF EXISTS {self.db_name}; DROP USER IF EXISTS '{self.db_user}'@'localhost'"
            subprocess.run(["mariadb", "-uroot", "-e", drop], capture_output=True, check=False)

    # ----------------------------------------------------------------- CLI helpers
    def env(self) -> dict[str, str]:
        # TZ=UTC so text outputs (sacct -P, scontrol) print UTC wall times, comparable with the JSON epochs.
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf), "TZ": "UTC", "SLURM_TIME_FORMAT": "standard"}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm CLI inside the namespace (nsenter, not `ip netns exec`, which remounts /sys)."""
        cmd = ["nsenter", f"--net=/run/netns/{self.netns}", *args]
        res = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise HarnessError(f"{' '.join(args)} -> rc {res.returncode}\n{res.stdout}\n{res.stderr}\n"
                               + self.log_tails())
        return res

    def sbatch(self, *args: str, wrap: str = "sleep 2") -> str:
        """Submit a batch job; return its job id as a string."""
        out = self.run("sbatch", "--parsable", "-D", str(self.state), "-o", "/dev/null", *args, "--wrap", wrap)
        return out.stdout.strip().split(";")[0]

    def sacct_json(self, *args: str) -> str:
        return self.run("sacct", "--json", "-a", *args).stdout

    def sacct_text(self, *fields: str, extra: tuple[str, ...] = ()) -> str:
        return self.run("sacct", "-a", "-P", "-n", "-X", "-o", ",".join(fields), *extra).stdout

    def squeue_json(self, *args: str) -> str:
        return self.run("squeue", "--json", *args).stdout

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 30) -> None:
        self._wait(what, predicate, timeout)

    def log_tails(self) -> str:
        return "\n".join(_tail(p) for p in sorted(self.log.glob("*.log")))

    # ----------------------------------------------------------------- internals
    def _make_netns(self) -> None:
        subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        ns = ["ip", "-n", self.netns]
        subprocess.run([*ns, "link", "set", "lo", "up"], check=True, capture_output=True)
        # Without a second loopback address, hostname lookups inside the namespace fail (see report).
        subprocess.run([*ns, "addr", "add", "127.0.0.2/8", "dev", "lo"], check=True, capture_output=True)

    def _make_gpu_devices(self) -> None:
        # gres.conf File= must point at real character devices or slurmd drops the GPUs; 195 is nvidia's major.
        for i in range(self.gpus_per_node):
            path = self.dev / f"nvidia{i}"
            if not path.exists():
                os.mknod(path, 0o666 | 0o020000, os.makedev(195, i))

    def _write_configs(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.db_password = secrets.token_hex(8)
        self.slurm_conf.write_text(self._slurm_conf())
        (self.etc / "gres.conf").write_text(self._gres_conf())
        dbd = self.etc / "slurmdbd.conf"
        dbd.write_text(self._slurmdbd_conf())
        dbd.chmod(0o600)  # slurmdbd refuses a world-readable config (it holds the DB password)

    def _slurm_conf(self) -> str:
        # proctrack/pgid + task/none + jobacct_gather/none: no cgroup plugin, so no cgroup setup is needed.
        # AccountingStoragePass is the munge socket for slurmdbd connections (AuthInfo is not used for those).
        # SlurmdParameters=config_overrides: the node lines claim more CPUs than this 2-core box has.
        common = f"""ClusterName={CLUSTER}
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.state}/ctld
SlurmdSpoolDir={self.state}/slurmd-%n
SlurmctldPidFile={self.state}/slurmctld.pid
SlurmdPidFile={self.state}/slurmd-%n.pid
SlurmctldLogFile={self.log}/slurmctld.log
SlurmdLogFile={self.log}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={DBD_PORT}
AccountingStorageTRES=gres/gpu
AccountingStoragePass={self.munge_socket}
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=2
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
"""
        nodes = "".join(
            f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={SLURMD_PORT0 + i} CPUs=4 "
            f"RealMemory=1000 Gres=gpu:{self.gpu_type}:{self.gpus_per_node} State=UNKNOWN\n"
            for i, n in enumerate(self.node_names))
        part = f"PartitionName=gpu Nodes={','.join(self.node_names)} Default=YES MaxTime=10 State=UP\n"
        return common + nodes + part

    def _gres_conf(self) -> str:
        last = self.gpus_per_node - 1
        lines = [f"NodeName={n} Name=gpu Type={self.gpu_type} File={self.dev}/nvidia[0-{last}]"
                 for n in self.node_names]
        return "AutoDetect=off\n" + "\n".join(lines) + "\n"

    def _slurmdbd_conf(self) -> str:
        # StorageHost=localhost makes libmariadb use the unix socket: 127.0.0.1:3306 is outside our namespace.
        return f"""AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
DbdHost={self.host}
DbdAddr=127.0.0.1
DbdPort={DBD_PORT}
SlurmUser=root
LogFile={self.log}/slurmdbd.log
PidFile={self.state}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser={self.db_user}
StoragePass={self.db_password}
StorageLoc={self.db_name}
"""

    def _make_database(self) -> None:
        # Dropped every run: job ids restart at 1 with fresh StateSaveLocation, stale rows would collide.
        sql = (f"DROP DATABASE IF EXISTS {self.db_name}; CREATE DATABASE {self.db_name}; "
               f"CREATE USER IF NOT EXISTS '{self.db_user}'@'localhost'; "
               f"ALTER USER '{self.db_user}'@'localhost' IDENTIFIED BY '{self.db_password}'; "
               f"GRANT ALL ON {self.db_name}.* TO '{self.db_user}'@'localhost';")
        res = subprocess.run(["mariadb", "-uroot", "-e", sql], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise HarnessError(f"MariaDB setup failed: {res.stderr.strip()}")

    def _start_munge(self) -> None:
        m = self.munge_socket.parent
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--seed-file={m / 'munged.seed'}", f"--log-file={self.log / 'munged.log'}"])
        self._wait("munge socket", self.munge_socket.exists, 10)

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.log / f"{name}.stdout.log", "wb")  # noqa: SIM115 - lives as long as the daemon
        cmd = ["nsenter", f"--net=/run/netns/{self.netns}", *argv]
        self.procs[name] = subprocess.Popen(cmd, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        out.close()

    def _dbd_answers(self) -> bool:
        return self.run("sacctmgr", "-n", "-P", "show", "cluster", check=False, timeout=5).returncode == 0

    def _nodes_idle(self) -> bool:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return len(states) == len(self.node_names) and all(s == "idle" for s in states.values())

    def _wait(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise HarnessError(f"waiting for {what}: daemon(s) exited: {dead}\n{self.log_tails()}")
            if predicate():
                return
            time.sleep(0.2)
        raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tails()}")

    def _kill_namespace_stragglers(self) -> None:
        # slurmstepd (proctrack/pgid) can outlive slurmd; every pid in our namespace was started by us.
        res = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True, check=False)
        for pid in (int(p) for p in res.stdout.split() if p.isdigit()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_slurm(nodes: int = 3) -> Iterator[SlurmCluster]:
    """Functional wrapper for SlurmCluster."""
    with SlurmCluster(nodes=nodes) as cluster:
        yield cluster
