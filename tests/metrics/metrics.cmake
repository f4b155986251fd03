# Tests of daemon/metrics (none yet).
