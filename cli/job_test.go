package cli

import (
	"testing"

	"github.com/ortbus/ortbus/codec"
)

func TestJobProgress(t *testing.T) {
	for _, c := range []struct {
		st   codec.JobStatus
		want string
	}{
		{codec.JobStatus{Job: "j", State: codec.JobRunning, Total: 300, Done: 100, Failed: 50, RatePerS: 12.5, EtaS: 12.4},
			"j [###############...............] 100/300 done  50 failed  12.5/s  ETA 12s"},
		{codec.JobStatus{Job: "j", State: codec.JobRunning, Total: 300},
			"j [..............................] 0/300 done  0 failed  0.0/s  ETA -"},
		{codec.JobStatus{Job: "j", State: codec.JobDone, Total: 3, Done: 3, RatePerS: 1},
			"j [##############################] 3/3 done  0 failed  1.0/s  done"},
		{codec.JobStatus{Job: "j", State: codec.JobCancelled},
			"j [..............................] 0/0 done  0 failed  0.0/s  cancelled"},
	} {
		if got := JobProgress(&c.st); got != c.want {
			t.Errorf("JobProgress(%+v)\n got %q\nwant %q", c.st, got, c.want)
		}
	}
}
