package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// TestOverheadTraceSmall runs overhead -trace with a few calls: the traced system's
// path is timed beside the untraced one and its spans reach the sink (the exports the
// table reports); every request of both is answered.
func TestOverheadTraceSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two gateways; skipped with -short")
	}
	root := testenv.RepoRoot(t)
	testenv.RuntimeLib(t, RuntimeVersion)
	bin := buildSystem(t, root)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var table bytes.Buffer
	rep, err := Overhead(ctx, Options{Repo: root, BinDir: bin, N: 300, Trace: true, Out: &table})
	t.Logf("overhead -trace:\n%s", table.String())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results.(*OverheadResults)
	tr := res.Traced
	if tr == nil || tr.Gateway.P50 <= 0 || res.Gateway.P50 <= 0 {
		t.Fatalf("traced %+v, untraced %+v", tr, res.Gateway)
	}
	// The batch exporter sends every 5 s by default, or at 512 spans: 300 traced calls
	// and their warm-up make over 4000 spans.
	if tr.Exports == 0 || tr.ExportBytes == 0 {
		t.Errorf("no span reached the sink: %+v", tr)
	}
	if !strings.Contains(table.String(), "gateway, traced (-trace)") {
		t.Errorf("the table has no traced row")
	}
}
