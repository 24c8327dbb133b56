package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/ortbus/ortbus/codec"
)

// jobBarWidth is the width of JobProgress's bar, in characters.
const jobBarWidth = 30

// JobProgress is one line of a job's progress for a terminal (no newline): a bar of the
// answered items, done/failed/total, items/s and the ETA while it runs, else its state.
func JobProgress(st *codec.JobStatus) string {
	answered := st.Done + st.Failed
	fill := 0
	if st.Total > 0 {
		fill = min(jobBarWidth, answered*jobBarWidth/st.Total)
	}
	bar := strings.Repeat("#", fill) + strings.Repeat(".", jobBarWidth-fill)
	line := fmt.Sprintf("%s [%s] %d/%d done  %d failed  %.1f/s", st.Job, bar, st.Done, st.Total, st.Failed, st.RatePerS)
	if st.Cached > 0 {
		line += fmt.Sprintf("  %d cached  %d computed", st.Cached, st.Computed)
	}
	if st.Finished() {
		return line + "  " + st.State
	}
	eta := "ETA -"
	if st.EtaS > 0 {
		eta = "ETA " + (time.Duration(st.EtaS * float64(time.Second))).Round(time.Second).String()
	}
	return line + "  " + eta
}
