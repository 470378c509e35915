"""General helpers that no one process owns, standard library only: ``periodic`` (the one
timer-loop shape of the daemon), ``processes`` (the one stop-and-wait, for the daemon, the CLI, the
tests and bench), ``procstat`` (``/proc/PID/stat``) and ``procgroups`` (ending a worker's process
group and session, for the spawner and the fork server).

Imports nothing of atomictoolsd outside this package, so any process may import it.
"""
