"""The chaos suite ("a study's record is always true"): a study of short trials on a private PostgreSQL
cluster, run by several drivers at once, while running training jobs are SIGKILLed, a job is SIGSTOPped past the
stall limit, a driver is SIGKILLed and started again with the same arguments, and PostgreSQL is restarted. Then the
study's record is held against the processes and the files the trials left, one invariant at a time.

    settings.py     the faulted study's shape (trials, drivers, steps, stall limit, heartbeat)
    postgres.py     a PostgreSQL cluster of the suite's own, which it may stop and start
    faults.py       what to inject and when (a fixed or a seeded random schedule)
    processes.py    the study's training processes, from /proc
    injector.py     runs the drivers and injects the faults
    record.py       the study record and the files its trials left, read back
    invariants.py   one function per invariant of the record
    report.py       what each fault did and what recovered it, as a table
    test_invariants.py   the suite: one faulted study per session, one test per invariant
    test_invariants_break.py   each invariant fails on a record built in memory that breaks it (fast lane)
    __main__.py     the long soak: `python -m tests.chaos` (`make soak`), docs/reliability.md (Soak)
"""
