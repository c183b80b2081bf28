"""queue-server benchmark: REST lease cycles against pgbench and pgqueuer, in one run."""
