"""A one-node Slurm on this machine, for tests and for a budget sweep through Slurm without a cluster.

:func:`start` installs Debian's ``slurm-wlm`` and ``munge`` where their programs are missing (as root, from the
package index), writes a ``slurm.conf`` for one node (this host, its CPUs and memory) under a directory of its own,
starts ``munged``, ``slurmctld`` and ``slurmd`` there (pid files, sockets, spool and logs all in that directory, ports
free at the start), waits until the node is idle, and returns a :class:`LocalSlurm` whose :meth:`LocalSlurm.stop`
stops them and removes the directory. Clients find the cluster through ``SLURM_CONF`` (:attr:`LocalSlurm.env`).

Where the daemons cannot start (not root, no package, a daemon that exits), :class:`SlurmUnavailable` says why; the
tests skip with that reason. The cgroup plugins need the cgroup hierarchies Slurm mounts and owns; inside a container
they do not work, so the node tracks processes by parent (``proctrack/linuxproc``), binds nothing (``task/none``),
and a job's ``--mem`` is enforced by the harness's own memory cgroup inside the job
(:mod:`harness.cluster.attempt`, which records which enforcer it was). Memory is not a consumable resource here
(``CR_CPU``): the node runs one job per CPU, whatever each asks in ``--mem``.

``python -m harness.tests.slurm_cluster start DIR`` starts one and leaves it running (``stop DIR`` stops it), for
``make budget-smoke EXECUTOR=slurm``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness.units import MIB

__all__ = ["LocalSlurm", "SlurmUnavailable", "start"]

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sacct")
PACKAGES = ("slurm-wlm", "munge")
START_TIMEOUT_S = 60.0
EPILOG = "/bin/true"
"""The node's epilog, as a real site has one (cleaning a job's scratch, say). It does nothing here, but a node that runs
an epilog reports each job's end with ``MESSAGE_EPILOG_COMPLETE``, on which slurmctld runs its scheduler at once; a
node without one reports only that the job's steps are gone, and the pending job waits for the scheduler's next
periodic pass (``sched_interval``, once a second at best): about half a second of an idle slot per job, measured."""


class SlurmUnavailable(RuntimeError):
    """The one-node Slurm cannot run here; the message says why."""


@dataclasses.dataclass
class LocalSlurm:
    """A running one-node Slurm: its directory, configuration, node name and daemons' pids."""

    directory: Path
    conf: Path
    node: str
    cpus: int
    pids: dict[str, int]

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs: ``SLURM_CONF`` naming this cluster's configuration."""
        return {"SLURM_CONF": str(self.conf)}

    def version(self) -> str:
        """``sbatch --version``'s answer, e.g. ``slurm-wlm 22.05.8``."""
        return subprocess.run(["sbatch", "--version"], env={**os.environ, **self.env}, capture_output=True,
                              text=True, check=False).stdout.strip()

    def stop(self) -> None:
        """Stop the daemons (SIGTERM, then SIGKILL after 10 s) and remove the directory."""
        procs = []
        for pid in self.pids.values():
            try:
                proc = psutil.Process(pid)
                proc.send_signal(signal.SIGTERM)
                procs.append(proc)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            proc.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def install() -> None:
    """Install ``slurm-wlm`` and ``munge`` with apt where any of :data:`PROGRAMS` is missing; raises
    :class:`SlurmUnavailable` where that cannot be done."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmUnavailable(f"{', '.join(missing)} missing, and installing {' '.join(PACKAGES)} needs root and apt")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SlurmUnavailable(f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}")


def _conf(directory: Path, node: str, cpus: int, memory_mib: int, ports: list[int]) -> str:
    return "\n".join([
        "ClusterName=harness-local",
        f"SlurmctldHost={node}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={directory / 'munge.socket'}",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={directory / 'spool'}",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory / 'slurmd.pid'}",
        f"SlurmctldLogFile={directory / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1",
        f"Epilog={EPILOG}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=3600",
        "KillWait=5",
        "OverTimeLimit=0",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mib} State=UNKNOWN",
        "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _spawn(name: str, command: list[str], directory: Path, env: dict[str, str]) -> int:
    log = open(directory / f"{name}.out", "wb")  # noqa: SIM115 - the daemon keeps it
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    log.close()
    return process.pid


def _wait(condition, what: str, directory: Path, timeout: float = START_TIMEOUT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    logs = " | ".join(f"{p.name}: {p.read_text(errors='replace').strip()[-300:]}"
                      for p in sorted(directory.glob("*.log")) + sorted(directory.glob("*.out")) if p.stat().st_size)
    raise SlurmUnavailable(f"{what} within {timeout:.0f} s; {logs}")


def start(directory: Path | None = None) -> LocalSlurm:
    """Install where missing, configure and start a one-node Slurm in ``directory`` (a new temporary directory by
    default); raises :class:`SlurmUnavailable` with the reason where it cannot, leaving nothing running."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("the daemons run as root here, and this process is not root")
    install()
    directory = Path(directory or tempfile.mkdtemp(prefix="harness-slurm-"))
    directory.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge"):
        (directory / sub).mkdir(exist_ok=True)
    os.chmod(directory, 0o755)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    memory_mib = psutil.virtual_memory().total // MIB
    conf = directory / "slurm.conf"
    conf.write_text(_conf(directory, node, cpus, memory_mib, _free_ports(2)))
    (directory / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    key = directory / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    os.chmod(directory / "munge", 0o700)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = LocalSlurm(directory, conf, node, cpus, {})
    try:
        cluster.pids["munged"] = _spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}", f"--socket={directory / 'munge.socket'}",
            f"--pid-file={directory / 'munged.pid'}", f"--log-file={directory / 'munged.log'}",
            f"--seed-file={directory / 'munge' / 'munge.seed'}"], directory, env)
        _wait(lambda: (directory / "munge.socket").exists(), "munged did not open its socket", directory)
        cluster.pids["slurmctld"] = _spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)], directory, env)
        cluster.pids["slurmd"] = _spawn("slurmd", ["slurmd", "-D", "-f", str(conf), "-N", node], directory, env)

        def idle() -> bool:
            for name, pid in cluster.pids.items():
                if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    raise SlurmUnavailable(f"{name} exited: " + _tail(directory, name))
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, check=False)
            return out.stdout.strip() == "idle"

        _wait(idle, "the node did not become idle", directory)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _tail(directory: Path, name: str) -> str:
    paths = (directory / f"{name}.log", directory / f"{name}.out")
    texts = [p.read_text(errors="replace").strip()[-400:] for p in paths if p.exists()]
    return " | ".join(t for t in texts if t) or "no log"


def main(argv: list[str]) -> int:
    """``start DIR`` (prints ``export SLURM_CONF=...``) or ``stop DIR``."""
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: python -m harness.tests.slurm_cluster start|stop DIR", file=sys.stderr)
        return 2
    directory = Path(argv[1]).resolve()
    if argv[0] == "start":
        try:
            cluster = start(directory)
        except SlurmUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={cluster.conf}  # {cluster.version()}, node {cluster.node}, {cluster.cpus} CPUs")
        return 0
    for pid_file in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int((directory / pid_file).read_text().split()[0]), signal.SIGTERM)
    time.sleep(2)
    shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
