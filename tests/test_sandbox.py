"""The code sandbox: HumanEval's canonical solutions pass, hostile programs get reward 0 and leave
the host unaffected. Each hostile program exits 0 (reward 1) only if its attack verifiably
worked, so reward 0 means the attack failed; the host-side checks confirm it independently."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time


from dare.data import TASKS
from dare.rewards.code import code_rewards, extract_code, humaneval_program
from dare.rewards.sandbox import Limits, isolation, run_program

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
    prog = humaneval_program(row["ground_truth"], e["prompt_code"], e["test"], e["entry_point"])
    assert prog.rstrip().endswith(f"check({e['entry_point']})")


def test_mbpp_program_runs_its_asserts():
    extra = {"test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"], "test_setup_code": ""}
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "def add(a, b):\n    return a - b"
    assert code_rewards([good, bad], [extra, extra]) == [1.0, 0.0]


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
               "    except OSError:\n        pass\nsys.exit(0 if ok else 1)\n") % (targets,)
    run_program(program, FAST)  # whatever it reports, nothing may appear on the host
    assert not any(os.path.exists(t) for t in targets)


def test_no_network_even_to_the_hosts_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    program = (f"import socket\nfor host in ('127.0.0.1', '1.1.1.1', 'example.com'):\n    try:\n"
               f"        socket.create_connection((host, {port} if host == '127.0.0.1' else 80), timeout=2)\n"
               f"        raise SystemExit(0)\n    except OSError:\n        pass\nraise SystemExit(1)\n")
    assert hostile(program) == 0.0
    time.sleep(0.2)
    assert accepted == []
    server.close()


def test_parent_environment_is_not_readable(monkeypatch):
    monkeypatch.setenv("DARE_TEST_SECRET", "s3cr3t-token")
    program = ("import os, glob, sys\nfound = 's3cr3t-token' in str(os.environ)\n"
               "for p in glob.glob('/proc/*/environ'):\n    try:\n"
               "        found |= b's3cr3t-token' in open(p, 'rb').read()\n    except OSError:\n        pass\n"
               "sys.exit(0 if found else 1)\n")
    assert hostile(program) == 0.0


def test_killing_the_parent_or_anything_else_fails():
    sentinel = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # exits 0 only if a kill of a host process (this test, the sentinel) was delivered
        program = ("import os, signal, sys\nkilled = False\nfor pid in (%d, %d):\n    try:\n"
                   "        os.kill(pid, signal.SIGKILL)\n        killed = True\n    except OSError:\n        pass\n"
                   "try:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
                   "sys.exit(0 if killed else 1)\n") % (os.getpid(), sentinel.pid)
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
    from sandbox_hostile import programs

    if os.geteuid() != 0:
        import pytest

        pytest.skip("the caller is not root here (the unprivileged test below covers it)")
    marker = f"dare-hostile-{os.getpid()}"
    monkeypatch.setenv("DARE_HOSTILE_SECRET", marker)  # in this (host) process's environment
    for name, program in programs(marker).items():
        out = run_program(program, Limits(wall_s=3, cpu_s=2))
        assert not out.passed, (name, out.output[-500:])
        assert len(out.output) <= 8192
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
    attacks = {k: v for k, v in report.items() if isinstance(v, dict)}
    assert len(attacks) >= 9 and not [k for k, v in attacks.items() if v["passed"]], attacks
    assert attacks["output_flood"]["output_bytes"] <= 8192
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
