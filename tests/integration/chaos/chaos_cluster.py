"""Processes of the chaos test's cluster: one router and worker slots the driver kills and
restarts itself (so that every incarnation can get its own fault profile through TANDEM_FAULTS).

Every slot keeps one log file across its incarnations and records, per incarnation, how it
started (fault profile), how it ended (the driver's signal or a crash) and its exit status."""
import os
import signal
import socket
import subprocess
import time

# Lines that mean a process crashed or broke an invariant, whatever its exit status.
CRASH_MARKERS = ("check failed:", " FATAL ", "AddressSanitizer", "UndefinedBehaviorSanitizer",
                 "runtime error:", "ThreadSanitizer", "LeakSanitizer", "terminate called",
                 "Segmentation fault", "stack smashing")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slot:
    """One process position (router, prefill i, decode i) on a fixed port."""

    def __init__(self, build_dir, name, command, args, log_dir, port=None):
        self.build_dir, self.name, self.command, self.args = build_dir, name, command, list(args)
        self.port = port or free_port()
        self.port_file = os.path.join(log_dir, f"{name}.port")
        self.log_path = os.path.join(log_dir, f"{name}.log")
        self.log = open(self.log_path, "ab")
        self.proc = None
        self.incarnations = []  # {"faults", "started", "ended", "signal", "returncode", "crash"}

    @property
    def role(self):
        return self.command

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self, faults="", timeout=60):
        if os.path.exists(self.port_file):
            os.unlink(self.port_file)
        env = dict(os.environ)
        env.pop("TANDEM_FAULTS", None)
        if faults:
            env["TANDEM_FAULTS"] = faults
        cmd = [os.path.join(self.build_dir, "bin", "tandem"), self.command, "--port",
               str(self.port), "--port-file", self.port_file] + self.args
        self.log.write(f"=== chaos: start {self.name} faults='{faults}' ===\n".encode())
        self.log.flush()
        deadline = time.time() + timeout
        while True:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
            inc = {"faults": faults, "started": time.time(), "ended": None, "signal": None,
                   "returncode": None, "crash": None, "pid": self.proc.pid}
            self.incarnations.append(inc)
            while not os.path.exists(self.port_file):
                if self.proc.poll() is not None:
                    break
                if time.time() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"{self.name} did not start:\n{self.tail()}")
                time.sleep(0.05)
            if self.proc.poll() is None:
                return
            # It exited while starting: the port may still be held by sockets of the previous
            # incarnation, so try again; a signal (a crash) is recorded.
            inc["ended"], inc["returncode"] = time.time(), self.proc.returncode
            if self.proc.returncode < 0:
                inc["crash"] = f"died with status {self.proc.returncode} while starting"
            if time.time() > deadline:
                raise RuntimeError(f"{self.name} failed to start:\n{self.tail()}")
            time.sleep(0.5)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig, timeout=60):
        """Sends `sig` and waits for the exit; returns the exit status."""
        inc = self.incarnations[-1]
        inc["signal"] = signal.Signals(sig).name
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            inc["crash"] = f"did not exit within {timeout}s of {inc['signal']}"
        inc["ended"], inc["returncode"] = time.time(), rc
        if sig == signal.SIGTERM and rc != 0 and not inc["crash"]:
            inc["crash"] = f"exit status {rc} after SIGTERM (drain)"
        return rc

    def check_unexpected_exit(self):
        """Records a death the driver did not cause; True if the process is gone."""
        if self.proc is None or self.proc.poll() is None:
            return False
        inc = self.incarnations[-1]
        if inc["ended"] is None:
            inc["ended"], inc["returncode"] = time.time(), self.proc.returncode
            inc["crash"] = f"died on its own with status {self.proc.returncode}"
        return True

    def tail(self, n=4000):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-n:]

    def log_text(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def crash_lines(self):
        return [line for line in self.log_text().splitlines()
                if any(m in line for m in CRASH_MARKERS)]
