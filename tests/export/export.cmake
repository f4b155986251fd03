# Tests of daemon/export (none yet).
