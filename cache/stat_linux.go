package cache

import "syscall"

// ctimeOf is a file's status change time (Unix ns).
func ctimeOf(st *syscall.Stat_t) int64 { return st.Ctim.Nano() }
