"""Idle RESP connections, for the server's resident memory per idle connection (dpdk_veth.rs).

Usage: dpdk_idle.py HOST PORT CONNECTIONS
Opens CONNECTIONS connections, one PING each (so each connection has taken and given back its
buffers once), prints `open N` and waits until standard input closes, then closes them all.
The connections are spread over processes of at most PER_PROCESS each (a process's open-file
limit may not be raised here). Exits 1 on a wrong answer or a refused connection.
"""
import os
import resource
import socket
import sys

PER_PROCESS = 15000
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = min(n, PER_PROCESS) + 64
if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


def hold(count, report):
    """Opens `count` connections, writes `open count` (or the error) to `report`, then holds
    them until the report pipe's reader (the parent) tells it to stop by closing stdin."""
    socks = []
    for i in range(count):
        try:
            s = socket.create_connection((host, port), timeout=30)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            got = b""
            while len(got) < 7:
                chunk = s.recv(64)
                if not chunk:
                    break
                got += chunk
        except OSError as e:
            got = repr(e).encode()
        if got != b"+PONG\r\n":
            os.write(report, f"connection {len(socks)}: {got!r}\n".encode())
            return socks
        socks.append(s)
    os.write(report, f"open {len(socks)}\n".encode())
    return socks


children, total, failed = [], 0, None
left = n
while left > 0:
    count = min(left, PER_PROCESS)
    left -= count
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        socks = hold(count, w)
        sys.stdin.read()
        os._exit(0)
    os.close(w)
    line = os.fdopen(r).readline().strip()
    children.append(pid)
    if line.startswith("open "):
        total += int(line.split()[1])
    else:
        failed = line
        break
print(failed or f"open {total}", flush=True)
sys.stdin.read()
for pid in children:
    os.waitpid(pid, 0)
sys.exit(1 if failed else 0)
