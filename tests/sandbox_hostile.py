"""Hostile programs for the code sandbox, shared by `tests/test_sandbox.py` (as root, in the test process)
and this file's driver (as an unprivileged user the test creates: `python3 sandbox_hostile.py <marker>`
prints {name: outcome} as JSON). Each program exits 0 only if its attack verifiably worked, so a program
that fails means the attack failed; the host-side checks in the tests confirm it independently.

`marker` names files the attacks try to create on the host (the tests look for them afterwards)."""

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITABLE = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"]  # world-writable host folders


def programs(marker: str) -> dict[str, str]:
    reads = [os.path.join(REPO, "README.md"), os.path.join(REPO, "pyproject.toml"), "/etc/passwd", "/etc/hostname",
             "/work", "/home", "/var", "/run"]
    return {
        # any host file or folder read at all (the repo, other repositories, /etc, /var, /run)
        "read_host_files": (
            "import os, sys\nhits = []\nfor p in %r:\n    try:\n        if os.path.isdir(p):\n"
            "            hits.append((p, os.listdir(p)))\n        else:\n            hits.append((p, open(p, 'rb').read(64)))\n"
            "    except OSError:\n        pass\nprint(hits)\nsys.exit(0 if hits else 1)\n") % (reads,),
        # the environment of any host process (the test puts the marker in its own)
        "host_environment": (
            "import glob, os, sys\nfound = %r in str(os.environ)\nfor p in glob.glob('/proc/*/environ'):\n    try:\n"
            "        found |= %r in open(p, 'rb').read()\n    except OSError:\n        pass\n"
            "sys.exit(0 if found else 1)\n") % (marker, marker.encode()),
        # a file in every world-writable host folder
        "write_host_folders": (
            "import os, sys\nok = 0\nfor d in %r:\n    try:\n        open(os.path.join(d, %r), 'w').write('x')\n"
            "        ok += 1\n    except OSError:\n        pass\nsys.exit(0 if ok == %d else 1)\n") % (
            WRITABLE, marker, len(WRITABLE)),
        # a daemon that double-forks and writes after the parent's timeout
        "daemon_after_timeout": (
            "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(4)\n"
            "        for d in %r:\n            try:\n                open(os.path.join(d, %r + '.daemon'), 'w').write('x')\n"
            "            except OSError:\n                pass\n        os._exit(0)\n    os._exit(0)\ntime.sleep(60)\n") % (
            WRITABLE, marker),
        # leave the namespaces or remount: unshare, setns, mount through ctypes
        "ctypes_namespaces": (
            "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nworked = []\n"
            "for flag in (0x10000000, 0x00020000, 0x40000000, 0x20000000):  # user, mount, net, pid\n"
            "    if libc.unshare(flag) == 0:\n        worked.append(('unshare', hex(flag)))\n"
            "for path in ('/proc/1/ns/net', '/proc/1/ns/mnt', '/proc/1/ns/user'):\n    try:\n"
            "        fd = os.open(path, os.O_RDONLY)\n        if libc.setns(fd, 0) == 0:\n            worked.append(('setns', path))\n"
            "    except OSError:\n        pass\n"
            "if libc.mount(b'tmpfs', b'/tmp', b'tmpfs', 0, None) == 0:\n    worked.append('mount')\n"
            "if libc.mount(b'/usr', b'/tmp', None, 4096 | 32, None) == 0:  # a writable remount of a bind\n"
            "    worked.append('remount')\nprint(worked)\nsys.exit(0 if worked else 1)\n"),
        # a flood of output: the parent keeps a bounded tail
        "output_flood": "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(200_000):\n    sys.stdout.write(line)\n"
                        "sys.exit(3)\n",
        # unbounded recursion with the interpreter's guard removed
        "deep_recursion": "import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
        # a fork bomb
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        # the network, even the host's loopback
        "network": "import socket, sys\nfor host, port in (('1.1.1.1', 80), ('127.0.0.1', 22)):\n    try:\n"
                   "        socket.create_connection((host, port), timeout=2)\n        sys.exit(0)\n    except OSError:\n"
                   "        pass\nsys.exit(1)\n",
    }


def host_files(marker: str) -> list[str]:
    """Every file an attack in `programs(marker)` would leave on the host."""
    return [os.path.join(d, marker + suffix) for d in WRITABLE for suffix in ("", ".daemon")]


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(REPO, "shared"))
    from dare.rewards.sandbox import Limits, isolation, run_program

    limits = Limits(wall_s=3, cpu_s=2)
    os.environ["DARE_HOSTILE_SECRET"] = sys.argv[1]
    out = {"isolation": isolation(), "uid": os.getuid()}
    for name, program in programs(sys.argv[1]).items():
        o = run_program(program, limits)
        out[name] = {"passed": o.passed, "status": o.status, "output_bytes": len(o.output)}
    out["canonical"] = run_program("import math\nassert math.comb(5, 2) == 10\n", limits).passed
    print(json.dumps(out))
