"""A receiver's background thread: jobs in the order given, handed over without waiting,
and a job that raises does not end the ones after it."""

from __future__ import annotations

import threading

from asyncrl.transport.weights._background import JobThread


def test_jobs_run_one_at_a_time_in_the_order_given() -> None:
    jobs, ran = JobThread("test-jobs"), []
    gate = threading.Event()
    jobs.submit(gate.wait)
    for index in range(5):
        jobs.submit(ran.append, index)
    assert ran == []  # the first job holds the thread, and submit did not wait for it
    gate.set()
    jobs.close(timeout=5)
    assert ran == [0, 1, 2, 3, 4]


def test_a_job_that_raises_does_not_stop_the_next() -> None:
    jobs, ran = JobThread("test-jobs"), []

    def broken() -> None:
        raise RuntimeError("a bug in a fetch")

    jobs.submit(broken)
    jobs.submit(ran.append, "after")
    jobs.close(timeout=5)
    assert ran == ["after"]


def test_close_ends_the_thread() -> None:
    jobs = JobThread("test-jobs-close")
    jobs.close(timeout=5)
    assert not any(t.name == "test-jobs-close" for t in threading.enumerate())


def test_the_owner_hears_of_a_job_that_raised() -> None:
    jobs, heard = JobThread("test-jobs"), []

    def broken() -> None:
        raise RuntimeError("a bug in a fetch")

    jobs.submit(broken, on_error=heard.append)
    jobs.close(timeout=5)
    assert [str(e) for e in heard] == ["a bug in a fetch"]
