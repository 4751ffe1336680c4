"""The two ends of a judged code reward, in one file that imports nothing from dare: its text runs under
`python -I -S` twice per program, once in the sandbox as the judged end (`serve`: the completion's code and
nothing else) and once in a separate process as the judge (`judge`: the task's tests). `dare.rewards.sandbox`
starts both (`run_judged`).

The judge never shares an interpreter with the code it judges: when a test calls the completion's function,
the judge sends the arguments to the judged end, which calls the function and sends back its return value.
What crosses is plain data in a strict encoding (`encode`, `decode`): None, bool, int, float, complex, str,
bytes, and lists, tuples, dicts, sets and frozensets of them, each of exactly its built-in type (a subclass
of str is not a str here). The judge rebuilds every value from built-in types, so nothing the completion
made, and no method of its own, reaches the tests: an object equal to everything arrives as an opaque
`Remote`, which equals only itself, has no truth value, and can only be passed back as an argument or
called. The tests never enter the judged end, and the judge's verdict goes to the caller through a pipe
the judged end does not hold, so reading the test's constants, jumping over its asserts or ending the
process early cannot make a pass.

Names: the tests see the judged end's top-level callables that neither the tests' own code nor Python's
built-ins define (so a completion cannot replace `set` or `abs` in the tests), and the stdlib modules of
`MODULES` that the completion imported at top level (an MBPP assert may use the completion's `math`); the
judge imports its own copy of those.
"""

import builtins
import os

MAX_MESSAGE = 16 << 20  # bytes in one message; a longer one fails the call
MAX_DEPTH = 200
MODULES = frozenset({"math", "cmath", "re", "collections", "itertools", "heapq", "functools", "operator", "string",
                     "bisect", "statistics", "fractions", "decimal", "copy", "datetime", "random", "sys"})


class Remote:
    """A value the judged end returned that is not plain data, held there and named here by number."""

    __slots__ = ("ref", "_call")

    def __init__(self, ref, call):
        self.ref, self._call = ref, call

    def __bool__(self):
        raise TypeError("a value the judged code returned is not plain data: it has no truth value in the tests")

    def __call__(self, *args, **kwargs):
        return self._call(self.ref, args, kwargs)

    def __repr__(self):
        return f"<remote object {self.ref}>"


class RemoteError(Exception):
    """An exception of the judged code that is not one of Python's built-in exceptions."""


# The encoding (bytes, no imports, so that neither end pays for json): N T F (None, True, False); i<hex>; and
# f<float.hex>; (int, float); c<hex>,<hex>; (complex); s<n>:<UTF-8> and b<n>:<bytes> (str, bytes); l t S Z d
# <n>: then n items (list, tuple, set, frozenset; a dict's n keys and values alternate); r<n>; (a reference).
_ATOMS = {None: b"N", True: b"T", False: b"F"}
_SEQUENCES = {list: b"l", tuple: b"t", set: b"S", frozenset: b"Z"}


def encode(value, keep=None) -> bytes:
    """`value` as plain data. `keep` (the judged end): a list that holds what is not plain data, sent as its
    index; without it, such a value raises TypeError."""
    out = []
    _encode(value, keep, out, 0)
    return b"".join(out)


def _encode(value, keep, out, depth):
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    kind = type(value)
    if value is None or kind is bool:
        out.append(_ATOMS[value])
    elif kind is int:
        out.append(b"i%x;" % value if value >= 0 else b"i-%x;" % -value)
    elif kind is float:
        out.append(b"f" + value.hex().encode() + b";")
    elif kind is str or kind is bytes:
        data = value.encode("utf-8", "surrogatepass") if kind is str else value
        out.append(b"%s%d:" % (b"s" if kind is str else b"b", len(data)))
        out.append(data)
    elif kind in _SEQUENCES:
        out.append(b"%s%d:" % (_SEQUENCES[kind], len(value)))
        for item in value:
            _encode(item, keep, out, depth + 1)
    elif kind is dict:
        out.append(b"d%d:" % len(value))
        for k, v in value.items():
            _encode(k, keep, out, depth + 1)
            _encode(v, keep, out, depth + 1)
    elif kind is complex:
        out.append(b"c" + value.real.hex().encode() + b"," + value.imag.hex().encode() + b";")
    elif kind is Remote:
        out.append(b"r%d;" % value.ref)
    elif keep is None:
        raise TypeError(f"not plain data: {kind.__name__}")
    else:
        keep.append(value)
        out.append(b"r%d;" % (len(keep) - 1))


def decode(data: bytes, remote):
    """Built-in values from `encode`'s bytes. `remote(n)`: what a reference becomes (the judge: a `Remote`;
    the judged end: the object it kept). Anything else is refused with ValueError."""
    value, end = _decode(data, 0, remote, 0)
    if end != len(data):
        raise ValueError("trailing bytes")
    return value


def _field(data, pos, stop):
    end = data.find(stop, pos, pos + 1100)
    if end < 0:
        raise ValueError("a field without its end")
    return data[pos:end].decode("ascii"), end + 1


def _decode(data, pos, remote, depth):
    if depth > MAX_DEPTH or pos >= len(data):
        raise ValueError("nested too deeply" if depth > MAX_DEPTH else "truncated")
    tag, pos = data[pos:pos + 1], pos + 1
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], pos
    if tag == b"i" or tag == b"r":
        end = data.find(b";", pos)
        if end < 0:
            raise ValueError("an int without its end")
        value = int(data[pos:end].decode("ascii"), 16)
        return (value if tag == b"i" else remote(value)), end + 1
    if tag == b"f":
        text, pos = _field(data, pos, b";")
        return float.fromhex(text), pos
    if tag == b"c":
        real, pos = _field(data, pos, b",")
        imag, pos = _field(data, pos, b";")
        return complex(float.fromhex(real), float.fromhex(imag)), pos
    count, pos = _field(data, pos, b":")
    if not count.isdigit():
        raise ValueError(f"a bad length {count!r}")
    n = int(count)
    if tag == b"s" or tag == b"b":
        if pos + n > len(data):
            raise ValueError("truncated")
        raw = data[pos:pos + n]
        return (raw.decode("utf-8", "surrogatepass") if tag == b"s" else raw), pos + n
    if n > len(data) - pos:
        raise ValueError("more items than bytes")
    items = []
    for _ in range(2 * n if tag == b"d" else n):
        item, pos = _decode(data, pos, remote, depth + 1)
        items.append(item)
    if tag == b"d":
        return dict(zip(items[::2], items[1::2])), pos
    kind = next((k for k, t in _SEQUENCES.items() if t == tag), None)
    if kind is None:
        raise ValueError(f"an unknown tag {tag!r}")
    return kind(items), pos


def send(fd, message, keep=None):
    """`message` encoded (`keep`: as `encode`'s) and framed by its length, written whole."""
    data = encode(message, keep)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(data)} bytes (at most {MAX_MESSAGE})")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


def _read(fd, n):
    out = bytearray()
    while len(out) < n:
        chunk = os.read(fd, min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the channel")
        out += chunk
    return bytes(out)


def receive(fd, remote):
    n = int.from_bytes(_read(fd, 4), "big")
    if n > MAX_MESSAGE:
        raise ValueError(f"a message of {n} bytes (at most {MAX_MESSAGE})")
    return decode(_read(fd, n), remote)


def _failure(error):
    return ("raise", type(error).__name__, str(error)[:1000])


def serve(code, requests, replies):
    """The judged end: run the completion's code as `__main__`, say which names it defined, then answer
    calls until the judge closes its end."""
    space = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(code, "<completion>", "exec"), space)
    except BaseException as error:  # SystemExit too: the program did not define its functions
        send(replies, _failure(error))
        return
    names = [k for k, v in space.items() if not k.startswith("__") and callable(v)]
    modules = [(k, v.__name__) for k, v in space.items() if type(v) is type(builtins) and v.__name__ in MODULES]
    send(replies, ("ready", names, modules))
    kept = []
    while True:
        try:
            request = receive(requests, kept.__getitem__)
        except EOFError:
            return
        try:
            _, target, args, kwargs = request
            function = space[target] if type(target) is str else kept[target]
            send(replies, ("ok", function(*args, **kwargs)), kept)
        except BaseException as error:
            send(replies, _failure(error))


def zygote(channel):
    """The judges' parent, one per trainer process: for each message on the `channel` socket (wall and CPU
    seconds, with the fds of one program's spec, requests, replies and verdict) it forks a judge, so that a
    judge costs a fork, not an interpreter's start. It ends when the trainer closes its end."""
    import signal
    import socket

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the judges
    sock = socket.socket(fileno=channel)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 64, 4)
        except OSError:
            return
        if not data:
            return
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            sock.close()
            _judge_process(int.from_bytes(data[:4], "big"), int.from_bytes(data[4:8], "big"), *fds)
        for fd in fds:
            os.close(fd)


def _judge_process(wall_s, cpu_s, spec, requests, replies, verdict):
    """(A forked judge) its limits, the spec from its pipe, the tests, then exit without cleanup."""
    import resource
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (its oom_score_adj of 1000 comes from the zygote)
    signal.alarm(wall_s + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    chunks = []
    while chunk := os.read(spec, 1 << 20):
        chunks.append(chunk)
    os.close(spec)
    judge(b"".join(chunks), requests, replies, verdict)
    os._exit(0)


def judge(spec, requests, replies, verdict):
    """The judge: run the tests (`spec`: encoded (setup, then, force)) against the judged end's functions; write
    b"P" to `verdict` only when the tests ran to their end, else b"F" and the reason."""
    try:
        _judge(*decode(spec, None), requests, replies)
    except BaseException as error:
        os.write(verdict, b"F" + f"{type(error).__name__}: {error}"[:2000].encode(errors="replace"))
        return
    os.write(verdict, b"P")


def _judge(setup, then, force, requests, replies):
    def remote(ref):
        return Remote(ref, call)

    def call(target, args, kwargs):
        send(requests, ("call", target, list(args), dict(kwargs)))
        reply = receive(replies, remote)
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "ok":
            return reply[1]
        if not (type(reply) is tuple and len(reply) == 3 and reply[0] == "raise"):
            raise ValueError("a malformed reply")
        kind = getattr(builtins, reply[1], None) if type(reply[1]) is str else None
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RemoteError
        raise kind(str(reply[2]))

    ready = receive(replies, remote)
    if not (type(ready) is tuple and len(ready) == 3 and ready[0] == "ready" and type(ready[1]) is list):
        raise RuntimeError(f"the code did not run: {ready}"[:2000])
    space = {"__name__": "__main__"}
    for alias, module in ready[2] if type(ready[2]) is list else ():
        if type(alias) is str and alias.isidentifier() and module in MODULES:
            space[alias] = __import__(module)
    exec(compile(setup, "<tests>", "exec"), space)
    defined = {n for n in ready[1] if type(n) is str}
    for name in force:
        if name not in defined:
            raise NameError(f"the code does not define {name}")
    for name in defined:
        if name in force or (name not in space and not hasattr(builtins, name)):
            space[name] = (lambda n: lambda *a, **k: call(n, a, k))(name)
    exec(compile(then, "<tests>", "exec"), space)
