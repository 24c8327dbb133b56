package bench

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// selfRSS is this process's resident memory.
func selfRSS(t *testing.T) int64 {
	t.Helper()
	p, err := procfs.Self()
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return int64(st.ResidentMemory())
}

// TestMemHolder runs the memory holder in this process: at its ready line the 64 MiB it
// maps are resident; SIGUSR1 gives them back (the resident memory falls by as much) and it
// says freed, its unmapping's start before its end; SIGTERM ends it with status 0. Bad
// sizes are a usage error.
func TestMemHolder(t *testing.T) {
	for _, bad := range [][]string{{"-bytes", "0"}, {"-bytes", "2TiB"}, {"-bytes", "lots"}, {}} {
		if code := MemHolderMain(bad, io.Discard, io.Discard); code != 2 {
			t.Errorf("%q: exit %d, want 2", bad, code)
		}
	}
	const size = 64 << 20
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	before := selfRSS(t)
	exit := make(chan int, 1)
	go func() { exit <- MemHolderMain([]string{"-bytes", "64MiB"}, w, io.Discard); w.Close() }()
	lines := bufio.NewScanner(r)
	next := func() MemHolderEvent {
		t.Helper()
		var ev MemHolderEvent
		if !lines.Scan() || json.Unmarshal(lines.Bytes(), &ev) != nil {
			t.Fatalf("no event line from the holder: %v", lines.Err())
		}
		return ev
	}
	ready := next()
	held := selfRSS(t)
	if ready.Event != MemHolderReady || ready.Bytes != size || ready.PID != os.Getpid() || held-before < size*9/10 {
		t.Fatalf("ready %+v, resident %d -> %d bytes: want 64 MiB more resident", ready, before, held)
	}
	// Its signal handler is in place from before the ready line: the signals reach it, not
	// this process's default action.
	syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	freed := next()
	if after := selfRSS(t); freed.Event != MemHolderFreed || freed.StartUnixUS <= 0 || freed.StartUnixUS > freed.UnixUS || held-after < size*9/10 {
		t.Errorf("freed %+v, resident %d -> %d bytes: want 64 MiB given back, the unmapping's start before its end", freed, held, after)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not end on SIGTERM")
	}
}
