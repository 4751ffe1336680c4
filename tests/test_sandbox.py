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
    # root and unprivileged namespaces exist here and in CI; without them the sandbox degrades
    assert os.geteuid() != 0 or isolation() == "namespaces"


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
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-u", "65534"], capture_output=True, text=True).stdout.split()
    assert left == [], f"sandbox processes survived: {left}"


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
