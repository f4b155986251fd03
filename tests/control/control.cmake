# Tests of daemon/control (none yet).
