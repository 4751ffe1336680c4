"""Hostile programs for the code sandbox, shared by `tests/test_sandbox.py` (as root, in the test process)
and this file's driver (as an unprivileged user the test creates: `python3 sandbox_hostile.py <marker>`
prints {name: outcome} as JSON). A program passes only when it runs to its end with status 0 (the sandbox
checks its end token), and each program here reaches its end only if its attack verifiably worked (it
exits 1 or never ends otherwise), so a program that fails means the attack failed; the host-side checks
in the tests confirm it independently.

`marker` names files the attacks try to create on the host (the tests look for them afterwards) and, cut
to 15 characters, the process name (`comm`) of the programs that try to outlive their call."""

import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITABLE = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock"]  # world-writable host folders
# prctl: clear the parent-death signal (bwrap's --die-with-parent), name the process for the host's checks
_STAY = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.prctl(1, 0)\nlibc.prctl(15, %r)\n")


def comm(marker: str) -> str:
    return marker[-15:]


def programs(marker: str) -> dict[str, str]:
    reads = [os.path.join(REPO, "README.md"), os.path.join(REPO, "pyproject.toml"), "/etc/passwd", "/etc/hostname",
             "/work", "/home", "/var", "/run"]
    stay = _STAY % comm(marker).encode()
    return {
        # any host file or folder read at all (the repo, other repositories, /etc, /var, /run)
        "read_host_files": (
            "import os, sys\nhits = []\nfor p in %r:\n    try:\n        if os.path.isdir(p):\n"
            "            hits.append((p, os.listdir(p)))\n        else:\n            hits.append((p, open(p, 'rb').read(64)))\n"
            "    except OSError:\n        pass\nprint(hits)\nif not hits:\n    sys.exit(1)\n") % (reads,),
        # the environment of any host process (the test puts the marker in its own)
        "host_environment": (
            "import glob, os, sys\nfound = %r in str(os.environ)\nfor p in glob.glob('/proc/*/environ'):\n    try:\n"
            "        found |= %r in open(p, 'rb').read()\n    except OSError:\n        pass\n"
            "if not found:\n    sys.exit(1)\n") % (marker, marker.encode()),
        # a file in every world-writable host folder
        "write_host_folders": (
            "import os, sys\nok = 0\nfor d in %r:\n    try:\n        open(os.path.join(d, %r), 'w').write('x')\n"
            "        ok += 1\n    except OSError:\n        pass\nif ok != %d:\n    sys.exit(1)\n") % (
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
            "    worked.append('remount')\nprint(worked)\nif not worked:\n    sys.exit(1)\n"),
        # a flood of output: the parent keeps a bounded tail
        "output_flood": "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(200_000):\n    sys.stdout.write(line)\n"
                        "sys.exit(3)\n",
        # unbounded recursion with the interpreter's guard removed
        "deep_recursion": "import sys\nsys.setrecursionlimit(10 ** 8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
        # a fork bomb
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        # the network, even the host's loopback
        "network": "import socket, sys\nreached = False\nfor host, port in (('1.1.1.1', 80), ('127.0.0.1', 22)):\n"
                   "    try:\n        socket.create_connection((host, port), timeout=2)\n        reached = True\n"
                   "    except OSError:\n        pass\nif not reached:\n    sys.exit(1)\n",
        # reward hacking: a wrong answer that ends the program with status 0 before (or after) its tests fail
        "exit_zero_before_tests": "import sys\ndef add(a, b):\n    return a - b\nsys.exit(0)\nassert add(1, 2) == 3\n",
        "os_exit_zero_before_tests": "import os\ndef add(a, b):\n    return a - b\nos._exit(0)\nassert add(1, 2) == 3\n",
        "raise_system_exit": "def add(a, b):\n    raise SystemExit(0)\nassert add(1, 2) == 3\n",
        "atexit_status_zero": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return a - b\n"
                              "assert add(1, 2) == 3\n",
        # a program that clears its parent-death signal and sleeps past its call
        "outlive_the_call": stay + "import time\ntime.sleep(30)\n",
        # children that clear it, leave the session, hold the output pipe and take every process slot they can,
        # while their parent returns at once
        "hold_the_slots": stay + "import os, time\nfor _ in range(64):\n    try:\n        if os.fork() == 0:\n"
                                 "            libc.prctl(1, 0)\n            os.setsid()\n            time.sleep(30)\n"
                                 "            os._exit(0)\n    except OSError:\n        break\nimport sys\nsys.exit(1)\n",
        # write to the root, /dev, /dev/shm (read-only inside: no tmpfs but /tmp)
        "write_root_and_dev": "import sys\nfor p in ('/x', '/dev/x', '/dev/shm/x', '/usr/x'):\n    open(p, 'wb').write(b'x' * 4096)\n",
        # run a shell or any program outside the interpreter
        "run_a_shell": "import subprocess\nsubprocess.run(['sh', '-c', 'true'], check=True)\n",
    }


def host_files(marker: str) -> list[str]:
    """Every file an attack in `programs(marker)` would leave on the host."""
    return [os.path.join(d, marker + suffix) for d in WRITABLE for suffix in ("", ".daemon")]


# Ways to pass a code reward without a correct answer (issue 60), for any entry point. Each one worked on the former
# sandbox, where the tests and an end token ran in the completion's own interpreter: the token was a 32-hex constant
# of the program and `check(...)` a line of it. Judged in a separate process, each must score 0.
_FIND_TOKEN = (
    "import os as _o, re as _r\n"
    "def _token(codes):\n"
    "    for code in codes:\n"
    "        for c in getattr(code, 'co_consts', ()):\n"
    "            text = c.decode('latin-1') if isinstance(c, bytes) else c if isinstance(c, str) else ''\n"
    "            m = _r.search('[0-9a-f]{32}', text)\n"
    "            if m:\n"
    "                return m.group(0)\n"
    "def _win(token):\n"
    "    if token:\n"
    "        _o.write(1, ('\\n' + token + '\\n').encode())\n"
    "        _o._exit(0)\n")


def reward_hacks(entry: str) -> dict[str, str]:
    """{name: a completion that defines `entry` without solving it and tries to pass anyway}."""
    return {
        # the program's constants hold the token: print it and leave with status 0
        "co_consts": _FIND_TOKEN + "import sys\n_win(_token([sys._getframe().f_code]))\n"
                                   f"def {entry}(*a, **k):\n    return None\n",
        # a trace function moves the line past `check(...)`, so the lines after it (the token's) run
        "f_lineno jump": (
            "import sys, dis\n"
            f"def {entry}(*a, **k):\n    return None\n"
            "_top = sys._getframe()\n"
            "_lines = sorted({i.positions.lineno for i in dis.get_instructions(_top.f_code) if i.positions.lineno})\n"
            "_check = [i.positions.lineno for i in dis.get_instructions(_top.f_code)\n"
            "          if i.opname == 'LOAD_NAME' and i.argval == 'check']\n"
            "def _jump(frame, event, arg):\n"
            "    if event == 'line' and _check and frame.f_lineno == _check[-1]:\n"
            "        frame.f_lineno = min(n for n in _lines if n > _check[-1])\n"
            "    return _jump\n"
            "_top.f_trace = _jump\nsys.settrace(lambda *a: None)\n"),
        # from the function's body, the callers' frames (the tests' and the module's) hold the token
        "inspect.stack": _FIND_TOKEN + "import inspect\n"
                                       f"def {entry}(*a, **k):\n"
                                       "    _win(_token([f.frame.f_code for f in inspect.stack()]))\n"
                                       "    return None\n",
        # every code object and frame the collector tracks
        "gc.get_objects": _FIND_TOKEN + "import gc, types\n"
                                        f"def {entry}(*a, **k):\n"
                                        "    objs = gc.get_objects()\n"
                                        "    _win(_token([o.f_code if isinstance(o, types.FrameType) else o for o in objs\n"
                                        "                 if isinstance(o, (types.FrameType, types.CodeType, types.FunctionType))]\n"
                                        "                + [o.__code__ for o in objs if isinstance(o, types.FunctionType)]))\n"
                                        "    return None\n",
        # the failed assert reaches the excepthook, which finds the token in the traceback's frames
        "sys.excepthook": _FIND_TOKEN + "import sys\n"
                                        "def _hook(kind, value, tb):\n"
                                        "    codes = []\n"
                                        "    while tb is not None:\n"
                                        "        codes.append(tb.tb_frame.f_code)\n"
                                        "        f = tb.tb_frame.f_back\n"
                                        "        while f is not None:\n"
                                        "            codes.append(f.f_code)\n"
                                        "            f = f.f_back\n"
                                        "        tb = tb.tb_next\n"
                                        "    _win(_token(codes))\n"
                                        "sys.excepthook = _hook\n"
                                        f"def {entry}(*a, **k):\n    return None\n",
        # no token at all: a str equal to everything (and its relatives), no answer in it
        "always-equal str": ("class _Any(str):\n"
                             "    def __eq__(self, other): return True\n"
                             "    def __ne__(self, other): return False\n"
                             "    def __lt__(self, other): return False\n"
                             "    def __gt__(self, other): return False\n"
                             "    def __le__(self, other): return True\n"
                             "    def __ge__(self, other): return True\n"
                             "    def __bool__(self): return True\n"
                             "    def __sub__(self, other): return 0\n"
                             "    def __rsub__(self, other): return 0\n"
                             "    def __abs__(self): return 0\n"
                             "    __hash__ = str.__hash__\n"
                             f"def {entry}(*a, **k):\n    return _Any('')\n"),
        # a builtin of the tests replaced: a top-level `abs`, `set` or `sorted` that makes any comparison hold
        "shadowed builtins": ("def abs(x):\n    return 0\n"
                              "def set(*a):\n    return 0\n"
                              "def sorted(*a, **k):\n    return 0\n"
                              "def len(*a):\n    return 0\n"
                              f"def {entry}(*a, **k):\n    return None\n"),
    }


def survivors(marker: str) -> list[str]:
    """Live processes named as the staying programs name themselves."""
    name, found = comm(marker), []
    for path in os.listdir("/proc"):
        try:
            with open(f"/proc/{path}/comm") as f:
                if f.read().strip() == name:
                    with open(f"/proc/{path}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(path)
        except (OSError, IndexError):
            pass
    return found


def hacks_table() -> None:
    """`python tests/sandbox_hostile.py --hacks`: each reward hack on all 164 HumanEval problems, through the RL
    reward and the OpenCompass metric, with the `dare` on PYTHONPATH (point it at another tree to compare)."""
    import time

    from dare.data import TASKS
    from dare.rewards.code import code_rewards, humaneval_pass

    extras = [r["extra"] for r in TASKS["humaneval"].build("test")]
    print(f"| hack | RL reward | OpenCompass metric | seconds |\n|---|---|---|---|")
    for name in reward_hacks("f"):
        t0 = time.monotonic()
        completions = [reward_hacks(e["entry_point"])[name] for e in extras]
        rl = sum(code_rewards(completions, extras))
        oc = sum(humaneval_pass([f"```python\n{c}```" for c in completions], extras))
        print(f"| {name} | {rl:.0f}/164 | {oc:.0f}/164 | {time.monotonic() - t0:.0f} |", flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["--hacks"]:
    hacks_table()
elif __name__ == "__main__":
    sys.path.insert(0, os.path.join(REPO, "shared"))
    from dare.rewards.sandbox import Limits, cgroups, isolation, run_program

    limits = Limits(wall_s=3, cpu_s=2)
    os.environ["DARE_HOSTILE_SECRET"] = sys.argv[1]
    out = {"isolation": isolation(), "uid": os.getuid(), "cgroups": cgroups()}
    for name, program in programs(sys.argv[1]).items():
        o = run_program(program, limits)
        out[name] = {"passed": o.passed, "status": o.status, "output_bytes": len(o.output)}
    out["survivors"] = survivors(sys.argv[1])
    out["canonical"] = run_program("import math\nassert math.comb(5, 2) == 10\n", limits).passed
    from dare.rewards.code import code_rewards, humaneval_pass

    # the reward hacks, through the RL reward (HumanEval and MBPP layouts) and the eval metric, on one problem
    he = {"prompt_code": 'def add(a, b):\n    """The sum."""\n', "test": "def check(candidate):\n"
          "    assert candidate(1, 2) == 3\n    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n", "entry_point": "add"}
    mbpp = {"test_list": ["assert add(1, 2) == 3", "assert set([add(1, 1)]) == {2}"], "test_setup_code": ""}
    hacks = ["def add(a, b):\n    return a + b\n", *reward_hacks("add").values()]
    scored = [code_rewards(hacks, [he] * len(hacks), limits), code_rewards(hacks, [mbpp] * len(hacks), limits),
              humaneval_pass([f"```python\n{h}```" for h in hacks], [he] * len(hacks))]
    out["reward_hacks"] = {"canonical": [s[0] for s in scored], "hacks": [sum(s[1:]) for s in scored]}
    print(json.dumps(out))
