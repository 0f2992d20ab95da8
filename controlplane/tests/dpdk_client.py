"""Many concurrent RESP clients that check every answer byte for byte (the DPDK end-to-end test).

Usage: dpdk_client.py HOST PORT CONNECTIONS REQUESTS ROWS_FILE TIMEOUT_SECS
ROWS_FILE: one `id<TAB>json` line per row of table `t` (the origin's row_to_json). Connection c's
request j asks for key (7c + 13j) mod 503 (ids above the table's and 0 are misses: nil); every
tenth request is an MGET of three keys. One request in flight per connection. Prints
`ok connections=.. requests=.. secs=..`; exits 1 with the first wrong answer or on timeout.
"""
import resource
import selectors
import socket
import sys
import time

host, port = sys.argv[1], int(sys.argv[2])
conns, reqs = int(sys.argv[3]), int(sys.argv[4])
rows = {}
with open(sys.argv[5], "rb") as f:
    for line in f:
        k, v = line.rstrip(b"\n").split(b"\t", 1)
        rows[int(k)] = v
timeout = float(sys.argv[6])

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
need = conns + 64
if soft < need:
    resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


def bulk(k):
    v = rows.get(k)
    return b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)


def command(*args):
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def request(c, j):
    k = (c * 7 + j * 13) % 503
    if j % 10 == 9:
        ks = [k, (k + 1) % 503, (k + 2) % 503]
        return command(b"MGET", *[b"t:%d" % x for x in ks]), b"*3\r\n" + b"".join(bulk(x) for x in ks)
    return command(b"GET", b"t:%d" % k), bulk(k)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


class Conn:
    __slots__ = ("c", "j", "sock", "out", "want", "buf", "connected")


sel = selectors.DefaultSelector()
start = time.monotonic()
for c in range(conns):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.connect_ex((host, port))
    st = Conn()
    st.c, st.j, st.sock, st.buf, st.connected = c, 0, s, b"", False
    st.out, st.want = request(c, 0)
    sel.register(s, selectors.EVENT_WRITE, st)


def send(st):
    try:
        n = st.sock.send(st.out)
    except OSError as e:
        fail("connection %d send after %d answers: %s" % (st.c, st.j, e))
    st.out = st.out[n:]
    sel.modify(st.sock, selectors.EVENT_WRITE if st.out else selectors.EVENT_READ, st)


done = answered = 0
while done < conns:
    if time.monotonic() - start > timeout:
        fail("timeout: %d of %d connections finished, %d answers" % (done, conns, answered))
    for key, ev in sel.select(1.0):
        st = key.data
        if ev & selectors.EVENT_WRITE:
            if not st.connected:
                err = st.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    fail("connection %d: connect error %d" % (st.c, err))
                st.connected = True
            send(st)
            continue
        try:
            data = st.sock.recv(65536)
        except OSError as e:
            fail("connection %d after %d answers (%s); %d connections finished, %d answers in all"
                 % (st.c, st.j, e, done, answered))
        if not data:
            fail("connection %d closed after %d answers; buffered %r" % (st.c, st.j, st.buf))
        st.buf += data
        if len(st.buf) < len(st.want):
            continue
        if st.buf != st.want:
            fail("connection %d request %d: got %r, want %r" % (st.c, st.j, st.buf, st.want))
        answered += 1
        st.j += 1
        st.buf = b""
        if st.j == reqs:
            sel.unregister(st.sock)
            st.sock.close()
            done += 1
        else:
            st.out, st.want = request(st.c, st.j)
            send(st)
print("ok connections=%d requests=%d secs=%.2f" % (conns, answered, time.monotonic() - start), flush=True)
