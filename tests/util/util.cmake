# Tests of daemon/util (none yet).
