"""tests/_launch.py's run(): a job whose launcher failed to start is started again, a job that
failed in any other way is not (its failure is the test's to report)."""
import _launch as launch


def counting_job(tmp_path, output, status):
    """A command that counts its starts in a file and fails, printing `output`, until its third."""
    count = tmp_path / "starts"
    script = (f'n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}; '
              f'[ $n -ge 3 ] && exit 0; echo "{output}" >&2; exit {status}')
    return ["sh", "-c", script], count


def test_a_launch_failure_is_started_again(tmp_path):
    cmd, count = counting_job(tmp_path, launch.LAUNCH_FAILURES[0] + " We cannot", 213)
    r = launch.run(cmd, timeout=30)
    assert r.returncode == 0 and count.read_text().strip() == "3"


def test_any_other_failure_is_reported_at_once(tmp_path):
    cmd, count = counting_job(tmp_path, "rank 1: assertion failed", 1)
    r = launch.run(cmd, timeout=30)
    assert r.returncode == 1 and "assertion failed" in r.stderr and count.read_text().strip() == "1"


def test_a_launcher_that_never_starts_gives_up(tmp_path):
    cmd = ["sh", "-c", f'echo "{launch.LAUNCH_FAILURES[0]}" >&2; exit 213']
    r = launch.run(cmd, timeout=30)
    assert r.returncode == 213 and launch.launch_failed(r.stderr)
