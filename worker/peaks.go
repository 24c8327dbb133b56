package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"sync"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/config"
	"github.com/ortbus/ortbus/models/modelrev"
)

// peakFloors keeps, for each model, the largest peak measured of it while its files stay
// the same, as the floor of what admission counts for it. Its rules:
//
//  1. A measured peak (source rss or device) is the growth of the process's memory over
//     a load and its warm-ups. A process that loaded the model before (a reload, a load
//     after an unload) reuses the pages the C heap and the runtime's arenas freed: its
//     memory hardly grows, and the measurement under-counts (a tagger reloaded measured
//     0.4 MiB against 13.5 MiB at start-up). Admission must never under-count, so a
//     model's admitted peak is never below the largest peak measured of the same files
//     with the same source: a lower measurement is raised to it, its source then
//     rss-kept or device-kept.
//  2. A model whose files changed (another file revision: fileRev) is measured afresh:
//     its measurement replaces the floor, whatever it is, its source rss or device.
//  3. A declared peak (the config's memory) is the operator's word: neither raised nor
//     kept.
//  4. Only a model that opened and warmed up is measured: a load that failed before keeps
//     no floor (one refused for memory after its measurement keeps it).
type peakFloors struct {
	mu sync.Mutex
	by map[string]peakFloor // by model name
}

// peakFloor is the largest peak measured of one revision of a model's files.
type peakFloor struct {
	rev    string
	source string
	bytes  int64
}

// keptSuffix marks a peak source whose figure is a floor kept from an earlier load
// (rule 1): "rss-kept", "device-kept".
const keptSuffix = "-kept"

func newPeakFloors() *peakFloors { return &peakFloors{by: map[string]peakFloor{}} }

// admit returns st, the status of a model just loaded from files of revision rev, with its
// peak raised to the model's floor (rule 1), and keeps the floor (rules 2 to 4).
func (f *peakFloors) admit(rev string, st codec.ModelStatus) codec.ModelStatus {
	if f == nil || st.State != codec.ModelReady || (st.PeakSource != "rss" && st.PeakSource != "device") {
		return st
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.by[st.Name]
	if ok && fl.rev == rev && fl.source == st.PeakSource && fl.bytes > st.PeakBytes {
		st.PeakBytes, st.PeakSource = fl.bytes, fl.source+keptSuffix
		return st
	}
	f.by[st.Name] = peakFloor{rev: rev, source: st.PeakSource, bytes: st.PeakBytes}
	return st
}

// fileRev is the revision of mc's files as a peak floor tells them apart (rule 2): the
// model's kind and batch limit (what its warm-ups run), and each file of its kind
// (modelrev.Files) by role, path, size and modification time. Unlike the result cache's
// revision it reads no file's bytes: a load must not hash gigabytes of weights for it.
func fileRev(mc *config.Model) string {
	d := sha256.New()
	fmt.Fprintf(d, "%s\x00%d\x00", mc.Kind, mc.MaxBatch)
	files, err := modelrev.Files(mc)
	if err != nil {
		fmt.Fprintf(d, "error\x00%v\x00", err)
	}
	for _, f := range files {
		fmt.Fprintf(d, "%s\x00%s\x00", f.Role, f.Path)
		if fi, err := os.Stat(f.Path); err == nil {
			fmt.Fprintf(d, "%d\x00%d\x00", fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return hex.EncodeToString(d.Sum(nil)[:16])
}
